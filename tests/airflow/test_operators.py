"""SparkJobOperator through a real spark-submit; sensors against real files and Delta tables."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.airflow.harness import ROOT
from tests.builders import FAST_AGGREGATES, day_events, make_spec, write_day

sys.path.insert(0, str(ROOT / "plugins"))  # Airflow puts the plugins folder on sys.path; so do we

from airflow.sdk.exceptions import AirflowException, AirflowFailException
from spark_jobs_airflow import DeltaVersionSensor, LandingPartitionSensor, SparkJobError, SparkJobOperator
from spark_jobs_airflow.operators import SparkTarget, resolve_master, resolve_target


def test_a_bad_spec_fails_the_task_with_the_jobs_message_and_exit_code_and_no_retry(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: Bad-Name\nsource: {path: x, format: parquet, event_time: t, schema: {t: timestamp}}\n"
                   "aggregates: [{name: n, fn: medain}]\nlake: lake\n")
    op = SparkJobOperator(task_id="combine", args=["combine", "--pipeline", str(bad), "--date", "2024-03-01"],
                          master="local[1]")
    with pytest.raises(SparkJobError) as info:
        op.execute({})
    assert info.value.exit_code == 2
    assert isinstance(info.value, AirflowFailException)  # a bad spec is not retried
    message = str(info.value)
    assert message.startswith("spark_jobs combine failed with exit code 2: error: invalid pipeline spec")
    assert "aggregates[0].fn: unknown function 'medain'" in message
    assert "(no retry: bad spec or arguments)" in message


def test_a_missing_input_fails_with_exit_code_3_and_may_be_retried(tmp_path, capfd):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    op = SparkJobOperator(task_id="combine", args=["combine", "--pipeline", spec.origin, "--date", "2024-03-09"],
                          master="local[1]")
    with pytest.raises(SparkJobError) as info:
        op.execute({})
    assert info.value.exit_code == 3 and not isinstance(info.value, AirflowFailException)
    assert "error: no landing partition" in str(info.value)
    out = "".join(capfd.readouterr())
    assert "running: " in out and "--master local[1]" in out


def test_the_job_log_is_streamed_into_the_task_log_and_its_last_line_returned(spark, tmp_path, capfd):
    from spark_jobs.jobs import combine

    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    write_day(tmp_path / "landing", "2024-03-01", day_events("2024-03-01", 20))
    combine.run(spark, spec, "2024-03-01")
    op = SparkJobOperator(task_id="inspect", master="local[1]",
                          args=["inspect", "tables", "--pipeline", spec.origin])
    last = op.execute({})
    out = "".join(capfd.readouterr())
    assert f"{ROOT / 'spark_jobs' / '__main__.py'} inspect tables" in out
    assert "views.partials" in out  # the job's own output, line by line in the task log
    assert last is not None and "views." in last


def test_run_as_a_file_the_cli_keeps_its_own_folder_off_sys_path(monkeypatch, capsys):
    # spark-submit runs spark_jobs/__main__.py as a script: Python puts spark_jobs/ first on sys.path,
    # where errors.py, session.py, jobs/, lake/, ... would be top-level modules shadowing others
    import runpy

    package = ROOT / "spark_jobs"
    monkeypatch.setattr(sys, "path", [str(package), *sys.path])
    monkeypatch.setattr(sys, "argv", [str(package / "__main__.py"), "--help"])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(package / "__main__.py"), run_name="__main__")
    assert info.value.code == 0 and "python -m spark_jobs" in capsys.readouterr().out
    assert sys.path[0] == str(ROOT) and str(package) not in sys.path


def test_the_master_comes_from_the_argument_the_connection_the_environment_or_local(monkeypatch):
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    assert resolve_master("spark://m:7077") == "spark://m:7077"
    assert resolve_master(conn_id="no_such_connection") == "local[*]"
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_TEST", '{"conn_type": "spark", "host": "spark://master", "port": 7077}')
    assert resolve_master(conn_id="spark_test") == "spark://master:7077"
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_HOST_ONLY", '{"conn_type": "spark", "host": "master"}')
    assert resolve_master(conn_id="spark_host_only") == "spark://master"
    monkeypatch.setenv("SPARK_MASTER", "local[3]")
    assert resolve_master(conn_id="no_such_connection") == "local[3]"
    op = SparkJobOperator(task_id="t", args=["reduce"], master="local[2]", driver_memory="512m")
    cmd = op.command("local[2]")
    assert cmd[1:5] == ["--master", "local[2]", "--driver-memory", "512m"]
    assert cmd[-2:] == [str(ROOT / "spark_jobs" / "__main__.py"), "reduce"]


def test_a_connect_server_comes_from_the_argument_the_connection_or_the_environment(monkeypatch):
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    monkeypatch.delenv("SPARK_MASTER", raising=False)
    assert resolve_target(remote="sc://h:1") == SparkTarget("connect", "sc://h:1")
    assert resolve_target(connect_conn_id="no_such_connection") == SparkTarget("submit", "local[*]")
    monkeypatch.setenv("SPARK_REMOTE", "sc://env:15002")
    assert resolve_target(connect_conn_id="no_such_connection") == SparkTarget("connect", "sc://env:15002")
    assert resolve_target(master="spark://m:7077") == SparkTarget("submit", "spark://m:7077")  # an explicit master wins
    monkeypatch.setenv("AIRFLOW_CONN_SC_TEST", '{"conn_type": "spark_connect", "host": "sc://conn", "port": 15003, '
                                               '"login": "me", "password": "t0k", "extra": {"use_ssl": true}}')
    assert resolve_target(connect_conn_id="sc_test") == SparkTarget(
        "connect", "sc://conn:15003/;user_id=me;token=t0k;use_ssl=true")
    monkeypatch.setenv("AIRFLOW_CONN_SC_HOST_ONLY", '{"conn_type": "spark_connect", "host": "conn"}')
    assert resolve_target(connect_conn_id="sc_host_only") == SparkTarget("connect", "sc://conn:15002")


def test_a_connection_token_with_url_characters_reaches_the_connect_client_intact(monkeypatch):
    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    token, user = "t0k;en/with=odd%chars?#", "me;you=/x"
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_SC_ODD", json.dumps({"conn_type": "spark_connect", "host": "conn", "port": 15003,
                                                          "login": user, "password": token,
                                                          "extra": {"use_ssl": True}}))
    target = resolve_target(connect_conn_id="sc_odd")
    assert target.kind == "connect"
    parsed = DefaultChannelBuilder(target.url)  # how pyspark's Spark Connect client reads $SPARK_REMOTE
    assert (parsed.token, parsed.userId, parsed.endpoint, parsed.use_ssl) == (token, user, "conn:15003", True)


def test_a_broken_connection_fails_instead_of_falling_back(monkeypatch):
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowSecretsBackendAccessDenied

    monkeypatch.setenv("SPARK_REMOTE", "sc://env:15002")  # a fallback that must not be taken
    monkeypatch.setenv("AIRFLOW_CONN_SC_BAD_EXTRA", '{"conn_type": "spark_connect", "host": "conn", '
                                                    '"extra": "{use_ssl: true"}')
    with pytest.raises(AirflowException, match=r"the extra of the Airflow connection 'sc_bad_extra' is not JSON "
                                               r"\(Expecting property name enclosed in double quotes at character 1\); "
                                               r'fix it, e.g. \{"use_ssl": true\}'):
        resolve_target(connect_conn_id="sc_bad_extra")

    def denied(conn_id: str) -> None:
        raise AirflowSecretsBackendAccessDenied(f"Access denied for connection {conn_id!r} by Execution API")

    monkeypatch.setattr(BaseHook, "get_connection", denied)
    with pytest.raises(AirflowSecretsBackendAccessDenied, match="Access denied for connection 'sc_denied'"):
        resolve_target(connect_conn_id="sc_denied")
    with pytest.raises(AirflowSecretsBackendAccessDenied, match="Access denied for connection 'spark_denied'"):
        resolve_master(conn_id="spark_denied")


@pytest.mark.slow
def test_on_a_connect_server_the_job_runs_in_the_warm_runner_with_its_log_and_exit_code(spark_server, tmp_path, capfd,
                                                                                        monkeypatch):
    monkeypatch.setenv("SPARK_JOBS_RUNNER", spark_server.runner)
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    write_day(tmp_path / "landing", "2024-03-01", day_events("2024-03-01", 30))
    op = SparkJobOperator(task_id="combine", remote=spark_server.remote,
                          args=["combine", "--pipeline", spec.origin, "--date", "2024-03-01"])
    last = op.execute({})
    assert last is not None and last.startswith("combine 2024-03-01 success: rows in 30")
    assert f"running on {spark_server.remote}, in the warm runner" in "".join(capfd.readouterr())
    op = SparkJobOperator(task_id="combine", remote=spark_server.remote,
                          args=["combine", "--pipeline", spec.origin, "--date", "2024-03-09"])
    with pytest.raises(SparkJobError) as info:
        op.execute({})
    assert info.value.exit_code == 3 and "error: no landing partition" in str(info.value)


def test_without_a_runner_a_connect_job_is_a_python_process_and_a_down_server_is_named(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("SPARK_JOBS_RUNNER", str(tmp_path / "no.sock"))
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    op = SparkJobOperator(task_id="reduce", remote="sc://127.0.0.1:9", args=["reduce", "--pipeline", spec.origin])
    with pytest.raises(SparkJobError) as info:
        op.execute({})
    assert info.value.exit_code == 6 and not isinstance(info.value, AirflowFailException)  # retried: it may come back
    assert "no Spark Connect server answers at sc://127.0.0.1:9" in str(info.value)
    out = "".join(capfd.readouterr())
    assert "no warm runner answers at" in out and "-m spark_jobs reduce" in out


def test_the_landing_sensor_waits_for_data_files(tmp_path):
    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    sensor = LandingPartitionSensor(task_id="wait", pipeline=spec.origin, date="2024-03-01")
    assert sensor.mode == "reschedule"
    assert sensor.poke({}) is False  # no folder
    part = tmp_path / "landing" / "event_date=2024-03-01"
    part.mkdir(parents=True)
    (part / "_SUCCESS").write_text("")
    (part / ".part-0.crc").write_text("")
    assert sensor.poke({}) is False  # markers are not data
    write_day(tmp_path / "landing", "2024-03-01", day_events("2024-03-01", 5))
    assert sensor.poke({}) is True


def test_the_delta_version_sensor_waits_for_the_version(tmp_path):
    path = str(tmp_path / "t")
    sensor = DeltaVersionSensor(task_id="wait", table_path=path, min_version=1)
    assert sensor.poke({}) is False
    write_deltalake(path, pa.table({"x": [1]}))
    assert sensor.poke({}) is False
    write_deltalake(path, pa.table({"x": [2]}), mode="append")
    assert sensor.poke({}) is True


def test_combine_skips_a_day_combined_after_its_newest_landing_file(tmp_path):
    import datetime as dt

    from spark_jobs_airflow.conditions import skip_unchanged_day

    from spark_jobs.jobs.run_record import RunRecord
    from spark_jobs.lake import PipelineTables

    spec = make_spec(tmp_path, aggregates=FAST_AGGREGATES)
    check = skip_unchanged_day(spec.origin)
    context = {"params": {"date": "2024-03-01"}}
    assert check(context) is None  # no landing day
    write_day(tmp_path / "landing", "2024-03-01", day_events("2024-03-01", 5))
    assert check(context) is None  # no runs table
    landed = max(p.stat().st_mtime for p in (tmp_path / "landing" / "event_date=2024-03-01").iterdir())
    runs = PipelineTables(spec.lake, spec.name).runs

    def record(job: str, status: str, seconds_after_landing: int) -> pa.Table:
        started = dt.datetime.fromtimestamp(landed + seconds_after_landing, dt.UTC)
        return RunRecord("r", spec.name, job, "2024-03-01", "embedded", started_at=started, status=status).to_arrow()

    write_deltalake(runs, record("combine", "success", -60))  # combined before the file landed
    write_deltalake(runs, record("combine", "failed", 60), mode="append")
    write_deltalake(runs, record("validate", "success", 120), mode="append")
    assert check(context) is None
    write_deltalake(runs, record("combine", "success", 60), mode="append")
    reason = check(context)
    assert reason is not None and reason.startswith("2024-03-01 was combined at ")
    assert check({"params": {"date": "2024-03-01", "force_recombine": True}}) is None


def test_operators_hold_arguments_only(tmp_path):
    # constructing an operator or sensor touches no Spark, no file and no connection
    op = SparkJobOperator(task_id="x", args=["combine", "--pipeline", str(tmp_path / "missing.yaml")])
    sensor = LandingPartitionSensor(task_id="y", pipeline=str(Path("missing.yaml")), date="2024-03-01")
    assert op.args[0] == "combine" and sensor.date == "2024-03-01"
