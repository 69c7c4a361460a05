"""The lake view: a read-only FastAPI app over the lake's Delta tables, served by Airflow's API server.

HTML pages (server-side Jinja templates, inline SVG chart, no JavaScript, no CDN assets) and a JSON API with the
same views, all from :mod:`spark_jobs.inspection`. Every route:

- requires an Airflow user (:func:`lake_view.auth.airflow_user`); pages redirect to Airflow's login, the JSON API
  answers 401;
- reads tables only by ``<pipeline>.<table>`` name, resolved inside the configured lake root (``$SPARK_JOBS_LAKE``
  or ``[lake_view] lake_root`` in airflow.cfg): no paths, no ``..``, no symlinks out of the lake;
- validates every query parameter (types, ranges, patterns, no unknown or repeated parameters; filters through
  the ``--where`` grammar, never SQL) and answers 400 with the reason otherwise;
- is a GET: nothing here writes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlencode

import pyarrow as pa
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.dependencies.utils import get_flat_dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException

from spark_jobs.errors import LakeError, PipelineError
from spark_jobs.inspection import InspectError, views
from spark_jobs.inspection.render import cell, diff_to_dict, human_bytes, jsonable
from spark_jobs.inspection.rollup import rollup
from spark_jobs.inspection.specs import find_spec, lake_spec
from spark_jobs.lake.spec_record import RecordedSpec

from .auth import NotAuthenticated, airflow_user, login_url
from .chart import svg_chart
from .rollup_view import MAX_ROLLUP_ROWS, MAX_SERIES, RollupForm, chart_metrics

if TYPE_CHECKING:
    from spark_jobs.lake.reader import Snapshot
    from spark_jobs.spec import PipelineSpec

__all__ = ["LAKE_CONF", "MAX_LIMIT", "app", "create_app"]

LAKE_CONF = ("lake_view", "lake_root")  # airflow.cfg section and key, after $SPARK_JOBS_LAKE
MAX_LIMIT = 500
TEMPLATES = Path(__file__).parent / "templates"

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
NameParam = Annotated[str, PathParam(max_length=130, pattern=r"^[a-z][a-z0-9_]*\.[a-z_]+$",
                                     description="<pipeline>.<table>, e.g. page_views.aggregates")]
VersionQ = Annotated[int | None, Query(ge=0, le=2**31, description="table version")]
WhereQ = Annotated[str | None, Query(max_length=2000, description="filter, e.g. page = '/home' AND views >= 10")]
ColumnsQ = Annotated[str | None, Query(max_length=2000, pattern=rf"^(|{_IDENT}(,{_IDENT})*)$")]
_SORT_KEY = rf"{_IDENT}(:(asc|desc))?"
OrderQ = Annotated[str | None, Query(max_length=400, pattern=rf"^(|{_SORT_KEY}(,{_SORT_KEY}){{0,7}})$")]
LimitQ = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
MetricQ = Annotated[str | None, Query(max_length=128, pattern=rf"^(|{_IDENT})$")]
PipelineQ = Annotated[str | None, Query(max_length=64, pattern=r"^(|[a-z][a-z0-9_]*)$")]
AsOfQ = Annotated[str | None, Query(max_length=40, description="time travel: 'YYYY-MM-DD[ HH:MM:SS]' UTC")]
FromQ = Annotated[int | None, Query(alias="from", ge=0, le=2**31, description="older version of a diff")]
StartQ = Annotated[str | None, Query(alias="from", max_length=40,
                                     description="rollup: first window start, 'YYYY-MM-DD[ HH:MM[:SS]]' UTC")]
EndQ = Annotated[str | None, Query(max_length=40, description="rollup: end of the range (exclusive), a window boundary")]
ByQ = Annotated[str | None, Query(max_length=2000, pattern=r"^[A-Za-z0-9_, ]*$",
                                  description="rollup: group keys to keep, e.g. page,country ('' merges every key)")]
GrainQ = Annotated[str | None, Query(max_length=40, description="rollup: all, or e.g. '1 hour', '1 day', '1 week'")]


def _blank(value: str | None) -> str | None:
    """An empty form field means the parameter is not given."""
    return value or None


def _strict_query(request: Request) -> None:
    """400 for query parameters the route does not take, or takes once but got twice."""
    allowed = {f.alias for f in get_flat_dependant(request.scope["route"].dependant).query_params}
    if unknown := sorted(set(request.query_params.keys()) - allowed):
        raise InspectError(f"unknown query parameter {', '.join(repr(u[:40]) for u in unknown[:5])}; "
                           f"this page takes {', '.join(sorted(allowed)) or 'none'}")
    if repeated := [k for k in allowed if len(request.query_params.getlist(k)) > 1]:
        raise InspectError(f"query parameter {repeated[0]!r} is given more than once; give it once")


def _is_api(request: Request) -> bool:
    return request.url.path.removeprefix(request.scope.get("root_path", "")).startswith("/api/")


def _url_for(request: Request) -> Callable[..., str]:
    """The templates' ``url(path, **params)``: a link under the app's mount point; empty params are left out."""
    base = request.scope.get("root_path", "")

    def url(path: str, **params: Any) -> str:
        query = urlencode({k: v for k, v in params.items() if v is not None and v != ""})
        return f"{base}{path}" + (f"?{query}" if query else "")

    return url


def _grid(table: pa.Table, *, width: int = 80) -> dict[str, Any]:
    """Header, formatted cells and numeric flags of an Arrow table, for the templates."""
    rows = [[cell(v, width=width) for v in row.values()] for row in table.to_pylist()]
    return {"header": table.column_names, "rows": rows, "numeric": [views.is_number(f.type) for f in table.schema]}


def _versions(r: views.TableRef) -> list[dict[str, Any]]:
    """The table's versions, newest first, with the commit time as text."""
    return [{**v, "committed_at": v["committed_at"].strftime("%Y-%m-%d %H:%M:%S")}
            for v in views.versions(r).to_pylist()]


def _table_view(r: views.TableRef, *, version: int | None, where: str | None, columns: str | None,
                order_by: str | None, limit: int) -> dict[str, Any]:
    """What ``table.html`` shows of one version of a table. A bad filter, column list or order is returned as
    ``rows_error``, not raised, so the rest of the page still shows; a bad version is raised."""
    vers = _versions(r)
    v = views.open_version(r, version=version).version()
    parts = views.partitions(r, version=v)
    try:
        rows, rows_error = _grid(views.show(r, version=v, where=where, columns=views.column_list(columns, "columns"),
                                            limit=limit, order_by=views.sort_keys(order_by))), None
    except InspectError as exc:
        rows, rows_error = None, str(exc)
    hist = views.history(r, limit=100)
    committed = next((x["committed_at"] for x in vers if x["version"] == v), "")
    summary = {"rows": sum(parts["rows"].to_pylist()), "files": sum(parts["files"].to_pylist()),
               "size": human_bytes(sum(parts["bytes"].to_pylist())), "committed_at": committed}
    schema_t = views.schema(r, version=v)
    windowed = "window_start" in schema_t["column"].to_pylist()
    # the served rows' history: the changelog, filtered as these rows are, in the order that folds to them
    log = str(Path(r.path).parent / "changelog")
    changes = f"{r.pipeline}.changelog" if r.table == "aggregates" and r.pipeline and views.is_delta(log) else None
    return {"pipeline": r.pipeline, "changes": changes, "version": v, "latest": vers[0]["version"], "versions": vers,
            "summary": summary, "diff_from": max(v - 1, 0), "windowed": windowed, "rows": rows,
            "rows_error": rows_error, "rollup": r.table == "aggregates" and windowed,
            "history": {**_grid(hist), "versions": hist["version"].to_pylist()}, "schema": _grid(schema_t),
            "partitions": _grid(parts)}


def _changed_grid(d: Any) -> dict[str, Any]:
    """The changed rows of a diff: the keys, then (old, new) for each column that changed in some row."""
    shown = [c for c in d.compared if any(c in cols for cols in d.changed["changed_columns"].to_pylist())]
    rows = [{"keys": [cell(row[k]) for k in d.keys],
             "cells": [(cell(row[f"{c}.old"], width=40), cell(row[f"{c}.new"], width=40))
                       if c in row["changed_columns"] else None for c in shown]}
            for row in d.changed.to_pylist()]
    return {"header": [*d.keys, *shown], "rows": rows}


def _rollup_request(ctx: _Context, name: str, version: int | None, *, start: str | None, end: str | None,
                    by: str | None, grain: str | None, where: str | None
                    ) -> tuple[views.TableRef, Snapshot, PipelineSpec, RecordedSpec | None, RollupForm]:
    """The aggregates table and its snapshot, its pipeline's spec (the one its lake records, else the spec file of that
    name in ``$SPARK_JOBS_PIPELINES``: a lake written before spec records) and that record, and the form."""
    pipeline, _, table = name.partition(".")
    if table != "aggregates":
        raise InspectError(f"a rollup merges a pipeline's aggregates table, not its {table}; open {pipeline}.aggregates")
    ref = ctx.ref(name)
    try:
        spec, record = lake_spec(ctx.lake_root(), pipeline)
    except InspectError:
        spec, record = find_spec(pipeline), None
    snapshot = views.open_version(ref, version=version)
    form = RollupForm.with_defaults(snapshot, spec, start=start, end=end, by=by, grain=grain, where=where)
    return ref, snapshot, spec, record, form


def _rollup_rows(snapshot: Snapshot, spec: PipelineSpec, form: RollupForm, record: RecordedSpec | None) -> pa.Table:
    """The rollup the form asks for, refused (400) when it is too big to send."""
    result = rollup(snapshot, spec, form.request(spec), record=record)
    if result.num_rows > MAX_ROLLUP_ROWS:
        raise InspectError(f"the rollup has {result.num_rows} rows, more than {MAX_ROLLUP_ROWS}; use a coarser grain, "
                           "fewer by keys, a shorter range or a where on the keys")
    return result


class _Context:
    """The lake root (looked up per request, so a lake created after start-up is found) and the templates."""

    def __init__(self, lake_root: str | None) -> None:
        self.configured = lake_root
        self.templates = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]),
                                     undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)

    def lake_root(self) -> str:
        root = self.configured or os.environ.get(views.LAKE_ENV)
        if not root:
            with contextlib.suppress(ImportError):  # without Airflow only the environment names the lake
                from airflow.configuration import conf

                root = conf.get(*LAKE_CONF, fallback=None)
        if not root:
            raise LakeError(f"no lake configured: set ${views.LAKE_ENV} (or [{LAKE_CONF[0]}] {LAKE_CONF[1]} in "
                            "airflow.cfg) for the Airflow API server")
        root = os.path.abspath(root)
        if not os.path.isdir(root):
            raise LakeError(f"lake root {root} does not exist; run a pipeline first or fix ${views.LAKE_ENV}")
        return root

    def ref(self, name: str) -> views.TableRef:
        """A ``<pipeline>.<table>`` name as a table confined to the lake root."""
        return views.resolve_table(name, self.lake_root(), confined=True)

    def tables(self) -> list[dict[str, Any]]:
        out = []
        for row in views.list_tables(self.lake_root()).to_pylist():
            row.pop("path")  # where the server keeps its files is not the page's business
            pipeline, kind = row["table"].split(".", 1)
            out.append({**row, "pipeline": pipeline, "kind": kind, "size": human_bytes(row["bytes"])})
        return out

    def page(self, request: Request, template: str, status: int = 200, **values: Any) -> HTMLResponse:
        root = ""
        with contextlib.suppress(LakeError):  # the error page of a missing lake shows no root
            root = self.lake_root()
        html = self.templates.get_template(template).render(url=_url_for(request), lake_root=root, **values)
        return HTMLResponse(html, status_code=status)

    def error(self, request: Request, status: int, title: str, message: str) -> Response:
        """``{"error": message}`` for the JSON API, the error page otherwise."""
        if _is_api(request):
            return JSONResponse({"error": message}, status_code=status)
        return self.page(request, "error.html", status, code=status, title=title, message=message)


async def _not_authenticated(request: Request, exc: NotAuthenticated) -> Response:
    if _is_api(request):
        return JSONResponse({"error": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
    try:
        target = login_url(str(request.url))
    except RuntimeError:  # no auth manager initialised (outside the API server): Airflow's default login path
        target = "/auth/login?" + urlencode({"next": str(request.url)})
    return RedirectResponse(target, status_code=302)


def _validation_message(exc: RequestValidationError) -> str:
    return "bad parameter " + "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ())[1:]) or 'request'}: "
                                        f"{e.get('msg', 'invalid')}" for e in exc.errors())


def _add_error_handlers(app: FastAPI, ctx: _Context) -> None:
    """Expected errors answer 400 (bad request: a PipelineError such as InspectError) or 404 (a LakeError: no lake,
    no table): JSON for the API, else the error page."""

    def answer(status: int | None, title: str, message: Callable[[Any], str] = str) -> Callable[..., Any]:
        async def handler(request: Request, exc: Any) -> Response:
            return ctx.error(request, status or exc.status_code, title, message(exc))
        return handler

    app.exception_handler(NotAuthenticated)(_not_authenticated)
    app.exception_handler(LakeError)(answer(404, "Not found"))
    app.exception_handler(PipelineError)(answer(400, "Bad request"))
    app.exception_handler(RequestValidationError)(answer(400, "Bad request", _validation_message))
    app.exception_handler(StarletteHTTPException)(answer(None, "Error", lambda exc: str(exc.detail)))


async def _security_headers(request: Request, call_next: Any) -> Response:
    response: Response = await call_next(request)
    response.headers.update({"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' "
                             "data:; form-action 'self'; frame-ancestors 'self'; base-uri 'none'",
                             "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
                             "Cache-Control": "no-store"})
    return response


def _rollup_json_url(request: Request, name: str, form: RollupForm, version: int) -> str:
    """The JSON API's URL of the rollup the page shows."""
    params = {"from": form.start, "to": form.end, "by": form.by, "grain": form.grain, "where": form.where,
              "version": version}  # by='' (merge every key) is kept: it is not "not given"
    return (f"{request.scope.get('root_path', '')}/api/table/{name}/rollup?"
            + urlencode({k: v for k, v in params.items() if v is not None}))


def _add_pages(router: APIRouter, ctx: _Context) -> None:
    """The HTML pages of the lake, its tables and their diffs (the charts: :func:`_add_chart_pages`)."""

    @router.get("/", response_class=HTMLResponse)
    def index(request: Request) -> HTMLResponse:
        return ctx.page(request, "index.html", tables=ctx.tables())

    @router.get("/table/{name}", response_class=HTMLResponse)
    def table_page(request: Request, name: NameParam, version: VersionQ = None, where: WhereQ = None,
                   columns: ColumnsQ = None, order_by: OrderQ = None, limit: LimitQ = 50) -> HTMLResponse:
        where, columns, order_by = _blank(where), _blank(columns), _blank(order_by)
        view = _table_view(ctx.ref(name), version=version, where=where, columns=columns, order_by=order_by, limit=limit)
        return ctx.page(request, "table.html", 400 if view["rows_error"] else 200, name=name, where=where,
                        columns=columns, order_by=order_by, limit=limit, max_limit=MAX_LIMIT, **view)

    @router.get("/runs", response_class=HTMLResponse)
    def runs_page(request: Request, pipeline: PipelineQ = None, limit: LimitQ = 200) -> HTMLResponse:
        pipeline = _blank(pipeline)
        pipelines = sorted({t["pipeline"] for t in ctx.tables() if t["kind"] == "runs"})
        try:
            runs = _grid(views.runs(ctx.lake_root(), pipeline=pipeline, limit=limit), width=120)
        except LakeError as exc:
            return ctx.page(request, "runs.html", 404, pipeline=pipeline, pipelines=pipelines, error=str(exc))
        return ctx.page(request, "runs.html", pipeline=pipeline, pipelines=pipelines, runs=runs, error=None)

    @router.get("/table/{name}/diff", response_class=HTMLResponse)
    def diff_page(request: Request, name: NameParam, from_: FromQ = None,
                  to: VersionQ = None, limit: LimitQ = 50) -> HTMLResponse:
        r = ctx.ref(name)
        vers = _versions(r)
        to_v = vers[0]["version"] if to is None else to
        from_v = max(to_v - 1, 0) if from_ is None else from_
        try:
            d = views.diff(r, from_version=from_v, to_version=to_v, limit=limit)
        except InspectError as exc:
            return ctx.page(request, "diff.html", 400, name=name, versions=vers, from_version=from_v,
                            to_version=to_v, limit=limit, error=str(exc))
        return ctx.page(request, "diff.html", name=name, versions=vers, from_version=d.from_version,
                        to_version=d.to_version, limit=limit, error=None, d=d, changed=_changed_grid(d),
                        added=_grid(d.added), removed=_grid(d.removed))


def _add_chart_pages(router: APIRouter, ctx: _Context) -> None:
    @router.get("/table/{name}/chart", response_class=HTMLResponse)
    def chart_page(request: Request, name: NameParam, metric: MetricQ = None, version: VersionQ = None,
                   where: WhereQ = None) -> HTMLResponse:
        r = ctx.ref(name)
        metric, where = _blank(metric), _blank(where)
        v = views.open_version(r, version=version).version()
        choices = [c["column"] for c in views.schema(r, version=v).to_pylist()  # the value columns a chart can plot
                   if c["role"] == "value" and c["type"].startswith(("int", "uint", "double", "float", "decimal"))]
        chosen = metric or (choices[0] if choices else None)
        common: dict[str, Any] = {"name": name, "versions": _versions(r), "version": v, "metrics": choices,
                                  "metric": chosen, "where": where}
        if chosen is None:
            return ctx.page(request, "chart.html", 400, error=f"{name} has no numeric value columns to chart", **common)
        try:
            s = views.series(r, metric=chosen, version=v, where=where)
        except InspectError as exc:
            return ctx.page(request, "chart.html", 400, error=str(exc), **common)
        return ctx.page(request, "chart.html", error=None, s=s, svg=Markup(svg_chart(s)), **common)

    @router.get("/table/{name}/rollup", response_class=HTMLResponse)
    def rollup_page(request: Request, name: NameParam, start: StartQ = None, to: EndQ = None, by: ByQ = None,
                    grain: GrainQ = None, where: WhereQ = None, metric: MetricQ = None,
                    version: VersionQ = None) -> HTMLResponse:
        r, snapshot, spec, record, form = _rollup_request(ctx, name, version, start=start, end=to, by=by,
                                                          grain=grain, where=where)
        common: dict[str, Any] = {"name": name, "spec": spec, "versions": _versions(r), "version": snapshot.version(),
                                  "form": form, "metric": _blank(metric)}
        try:
            result = _rollup_rows(snapshot, spec, form, record)
            metrics = chart_metrics(result, spec)
            chosen = _blank(metric) or metrics[0]
            if chosen not in metrics:  # a chart draws a numeric aggregate
                raise InspectError(f"metric {chosen!r} is not a numeric aggregate of {spec.name}; "
                                   f"choose one of {', '.join(metrics)}")
            s = views.Series.of(result, table=name, version=snapshot.version(), metric=chosen,
                                keys=form.request(spec).by, x="start", max_lines=MAX_SERIES)
        except InspectError as exc:
            return ctx.page(request, "rollup.html", 400, error=str(exc), metrics=chart_metrics(None, spec), **common)
        shown = result.slice(0, MAX_LIMIT)
        return ctx.page(request, "rollup.html", error=None, metrics=metrics, **{**common, "metric": chosen},
                        rows=_grid(shown), n_rows=result.num_rows, n_shown=shown.num_rows, s=s,
                        json_url=_rollup_json_url(request, name, form, snapshot.version()),
                        svg=Markup(svg_chart(s, x_label="bucket start")))


def _add_api(router: APIRouter, ctx: _Context) -> None:
    @router.get("/api/tables")
    def api_tables() -> JSONResponse:
        return JSONResponse(jsonable(ctx.tables()))

    @router.get("/api/table/{name}/versions")
    def api_versions(name: NameParam) -> JSONResponse:
        return JSONResponse(jsonable(views.versions(ctx.ref(name)).to_pylist()))

    @router.get("/api/table/{name}/history")
    def api_history(name: NameParam, limit: LimitQ = 100) -> JSONResponse:
        return JSONResponse(jsonable(views.history(ctx.ref(name), limit=limit).to_pylist()))

    @router.get("/api/table/{name}/rows")
    def api_rows(name: NameParam, version: VersionQ = None, as_of: AsOfQ = None, where: WhereQ = None,
                 columns: ColumnsQ = None, order_by: OrderQ = None, limit: LimitQ = 50) -> JSONResponse:
        rows = views.show(ctx.ref(name), version=version, as_of=_blank(as_of), where=_blank(where), limit=limit,
                          columns=views.column_list(_blank(columns), "columns"), order_by=views.sort_keys(order_by))
        return JSONResponse(jsonable(rows.to_pylist()))

    @router.get("/api/table/{name}/diff")
    def api_diff(name: NameParam, from_: Annotated[int, Query(alias="from", ge=0, le=2**31)], to: VersionQ = None,
                 keys: ColumnsQ = None, limit: LimitQ = 50) -> JSONResponse:
        return JSONResponse(diff_to_dict(views.diff(ctx.ref(name), from_version=from_, to_version=to, limit=limit,
                                                    keys=views.column_list(_blank(keys), "keys"))))

    @router.get("/api/table/{name}/schema")
    def api_schema(name: NameParam, version: VersionQ = None) -> JSONResponse:
        return JSONResponse(jsonable(views.schema(ctx.ref(name), version=version).to_pylist()))

    @router.get("/api/table/{name}/partitions")
    def api_partitions(name: NameParam, version: VersionQ = None) -> JSONResponse:
        return JSONResponse(jsonable(views.partitions(ctx.ref(name), version=version).to_pylist()))

    @router.get("/api/table/{name}/series")
    def api_series(name: NameParam, metric: Annotated[str, Query(max_length=128, pattern=rf"^{_IDENT}$")],
                   version: VersionQ = None, where: WhereQ = None) -> JSONResponse:
        s = views.series(ctx.ref(name), metric=metric, version=version, where=_blank(where))
        lines = [{"label": label, "points": points} for label, points in s.lines]
        return JSONResponse(jsonable({"table": s.table, "version": s.version, "metric": s.metric, "keys": s.keys,
                                      "n_keys": s.n_keys, "lines": lines}))

    @router.get("/api/table/{name}/rollup")
    def api_rollup(name: NameParam, start: StartQ = None, to: EndQ = None, by: ByQ = None, grain: GrainQ = None,
                   where: WhereQ = None, version: VersionQ = None) -> JSONResponse:
        _, snapshot, spec, record, form = _rollup_request(ctx, name, version, start=start, end=to, by=by,
                                                          grain=grain, where=where)
        return JSONResponse(jsonable(_rollup_rows(snapshot, spec, form, record).to_pylist()))

    @router.get("/api/runs")
    def api_runs(pipeline: PipelineQ = None, limit: LimitQ = 200) -> JSONResponse:
        return JSONResponse(jsonable(views.runs(ctx.lake_root(), pipeline=_blank(pipeline), limit=limit).to_pylist()))


def create_app(*, lake_root: str | None = None, authenticate: bool = True) -> FastAPI:
    """The lake view app. ``authenticate=False`` is for tests that run without an Airflow API server."""
    ctx = _Context(lake_root)
    app = FastAPI(title="Lake view", description=__doc__, docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app, ctx)
    app.middleware("http")(_security_headers)
    auth: list[Any] = [Depends(airflow_user)] if authenticate else []
    # authentication runs first: an anonymous request learns nothing about the parameters or the tables
    router = APIRouter(dependencies=[*auth, Depends(_strict_query)])
    for add in (_add_pages, _add_chart_pages, _add_api):
        add(router, ctx)
    app.include_router(router)
    return app


app = create_app()
