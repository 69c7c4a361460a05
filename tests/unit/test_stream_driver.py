"""The driver-side mini-batch merge over Arrow tables, without Spark: Flink's changelog rules."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa

from spark_jobs.phases.compiled import CompiledAggregates
from spark_jobs.spec import PipelineSpec, parse_spec
from spark_jobs.stream.arrow_engine import merge_on_driver, partial_rows

T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
TS = pa.timestamp("us", tz="UTC")


def spec(op_column: str | None = None, **extra: Any) -> PipelineSpec:
    schema = {"at": "timestamp", "name": "string", "score": "long", **({op_column: "string"} if op_column else {})}
    return parse_spec({"name": "scores", "lake": "lake", "group_by": ["name"], **extra,
                       "source": {"path": "landing", "event_time": "at", "schema": schema,
                                  **({"op_column": op_column} if op_column else {})},
                       "aggregates": [{"name": "cnt", "fn": "count"}, {"name": "low", "fn": "min", "column": "score"}]})


def state_schema(compiled: CompiledAggregates) -> pa.Schema:
    low = pa.map_(pa.int64(), pa.int64()) if compiled.retracting else pa.int64()
    return pa.schema([("event_date", pa.date32()), ("name", pa.string()), ("n_rows", pa.int64()),
                      ("cnt__count", pa.int64()), ("low__" + ("counts" if compiled.retracting else "value"), low),
                      ("max_event_time", TS), ("spec_version", pa.int64())])


def partials_schema(compiled: CompiledAggregates) -> pa.Schema:
    state = state_schema(compiled)
    return pa.schema([("batch", pa.string()), ("source", pa.string()), *list(state)[:5], ("run_id", pa.string()),
                      ("created_at", TS), ("spec_version", pa.int64())])


def schemas(compiled: CompiledAggregates, bounds: list[tuple[str, pa.DataType]] | None = None) -> dict[str, pa.Schema]:
    state, bounds = state_schema(compiled), bounds or []
    values = [("cnt", pa.int64()), ("low", pa.int64())]
    partials = partials_schema(compiled)
    return {"partials": pa.schema([*list(partials)[:4], *bounds, *list(partials)[4:]]),
            "aggregates": pa.schema([("name", pa.string()), *bounds, *values, *list(state)[2:5], ("updated_at", TS),
                                     ("run_id", pa.string()), ("spec_version", pa.int64())]),
            "changelog": pa.schema([("op", pa.string()), ("name", pa.string()), *bounds, *values,
                                    ("batch_id", pa.int64()), ("seq", pa.int64())])}


def delta(compiled: CompiledAggregates, rows: list[tuple[str, int, Any, int]]) -> pa.Table:
    """Pre-aggregated batch rows (name, n_rows, low accumulator, minute of the row's first event)."""
    schema = state_schema(compiled)
    return pa.Table.from_pylist(
        [{"event_date": T0.date(), "name": n, "n_rows": k, "cnt__count": k, schema.field(4).name: low,
          "max_event_time": T0 + dt.timedelta(minutes=m), "spec_version": 1, "_first_seen": T0 + dt.timedelta(minutes=m)}
         for n, k, low, m in rows], schema=schema.append(pa.field("_first_seen", TS)))


def run(compiled: CompiledAggregates, batches: list[list[tuple[str, int, Any, int]]]
        ) -> tuple[list[str], pa.Table, Any]:
    state = state_schema(compiled).empty_table()
    ops: list[str] = []
    result = None
    for batch_id, rows in enumerate(batches):
        result = merge_on_driver(delta(compiled, rows), state, compiled, schemas=schemas(compiled), batch_id=batch_id,
                                 closes=None, run_id="r", now=T0)
        ops += [f"{r['op']}[{r['name']},{r['cnt']}]" for r in result.changelog.to_pylist()]
        assert result.changelog.column("seq").to_pylist() == list(range(result.changelog.num_rows))
        state = result.state
    return ops, state, result


def test_one_row_per_batch_gives_flinks_retraction_changelog():
    compiled = CompiledAggregates(spec())
    ops, state, result = run(compiled, [[("Tom", 1, 12, 0)], [("John", 1, 15, 1)], [("Tom", 1, 18, 2)],
                                     [("Tom", 1, 19, 3)]])
    assert " ".join(ops) == "+I[Tom,1] +I[John,1] -U[Tom,1] +U[Tom,2] -U[Tom,2] +U[Tom,3]"
    assert sorted((r["name"], r["n_rows"], r["low__value"]) for r in state.to_pylist()) == [
        ("John", 1, 15), ("Tom", 3, 12)]
    assert result.aggregates.to_pylist()[0] | {"updated_at": None} == {
        "name": "Tom", "cnt": 3, "low": 12, "n_rows": 3, "cnt__count": 3, "low__value": 12, "updated_at": None,
        "run_id": "r", "spec_version": 1}
    assert result.partials.num_rows == 1  # one state write: the batch's one pre-aggregated row


def test_all_rows_in_one_batch_give_only_the_final_values_in_first_event_order():
    compiled = CompiledAggregates(spec())
    ops, _, _ = run(compiled, [[("John", 1, 15, 1), ("Tom", 3, 12, 0)]])
    assert ops == ["+I[Tom,3]", "+I[John,1]"]


def test_retracted_keys_are_deleted_and_min_falls_back_to_the_next_value():
    compiled = CompiledAggregates(spec(op_column="op"))
    ops, state, result = run(compiled, [
        [("Tom", 2, [(10, 1), (20, 1)], 0), ("Ann", 1, [(7, 1)], 1)],
        [("Tom", -1, [(10, -1)], 2), ("Ann", -1, [(7, -1)], 3)],
    ])
    assert ops == ["+I[Tom,2]", "+I[Ann,1]", "-U[Tom,2]", "+U[Tom,1]", "-D[Ann,1]"]
    assert [(r["name"], r["low"]) for r in result.changelog.to_pylist()] == [("Tom", 10), ("Tom", 20), ("Ann", 7)]
    assert [r["name"] for r in state.to_pylist()] == ["Tom"]  # Ann's state is gone with its last row
    assert [r["name"] for r in result.aggregates.to_pylist()] == ["Tom"]
    assert sorted(result.touched.column("name").to_pylist()) == ["Ann", "Tom"]  # Ann leaves aggregates too


def test_closed_windows_leave_state():
    compiled = CompiledAggregates(spec(window={"size": "5 minutes"}))
    bounds = [("window_start", TS), ("window_end", TS)]
    state = pa.schema([*list(state_schema(compiled))[:2], *bounds, *list(state_schema(compiled))[2:]]).empty_table()
    rows = delta(compiled, [("Tom", 1, 12, 0), ("Ann", 1, 3, 9)])
    rows = rows.append_column("window_start", pa.array([T0, T0 + dt.timedelta(minutes=5)], TS)).append_column(
        "window_end", pa.array([T0 + dt.timedelta(minutes=5), T0 + dt.timedelta(minutes=10)], TS))
    out = merge_on_driver(rows.select([*state.column_names, "_first_seen"]), state, compiled,
                          schemas=schemas(compiled, bounds), batch_id=0, closes=T0 + dt.timedelta(minutes=5),
                          run_id="r", now=T0)
    assert out.state.column("name").to_pylist() == ["Ann"]
    assert out.aggregates.num_rows == 2  # closing a window drops its state, not its values


def test_partial_rows_lay_out_the_batch_like_the_partials_table():
    compiled = CompiledAggregates(spec())
    schema = pa.schema([("batch", pa.string()), ("source", pa.string()), ("event_date", pa.date32()),
                        ("name", pa.string()), ("n_rows", pa.int64()), ("cnt__count", pa.int64()),
                        ("low__value", pa.int64()), ("run_id", pa.string()), ("created_at", TS)])
    out = partial_rows(delta(compiled, [("Tom", 2, 12, 0)]), schema, batch="stream-4", run_id="r", now=T0)
    assert out.to_pylist() == [{"batch": "stream-4", "source": "stream", "event_date": T0.date(), "name": "Tom",
                                "n_rows": 2, "cnt__count": 2, "low__value": 12, "run_id": "r", "created_at": T0}]


def test_a_pipeline_without_keys_merges_all_rows_into_one_served_row():
    """No ``group_by`` and no window: the driver's merge has no keys (one group of all rows, none for no rows)."""
    compiled = CompiledAggregates(spec(group_by=[]))
    state = pa.schema([f for f in state_schema(compiled) if f.name != "name"])
    no_name = {k: pa.schema([f for f in v if f.name != "name"]) for k, v in schemas(compiled).items()}
    rows = delta(compiled, [("-", 2, 5, 0)]).drop_columns(["name"])
    ops, held = [], state.empty_table()
    for batch_id, batch in enumerate([rows, rows.set_column(3, "low__value", pa.array([3])), rows.slice(0, 0)]):
        out = merge_on_driver(batch, held, compiled, schemas=no_name, batch_id=batch_id, closes=None, run_id="r",
                              now=T0)
        ops += [(r["op"], r["cnt"], r["low"]) for r in out.changelog.to_pylist()]
        held = out.state
        assert held.num_rows == 1
    assert ops == [("+I", 2, 5), ("-U", 2, 5), ("+U", 4, 3)]
    assert out.aggregates.num_rows == 0  # an empty batch rewrites nothing
