"""Airflow plugin: the lake view (FastAPI app) at ``/lake`` on the API server, and a "Lake" entry in the UI menu.

Airflow puts the plugins folder on ``sys.path``, so the app is imported as the ``lake_view``
package; ``.airflowignore`` keeps Airflow from loading that package's modules one by one as plugins.
The page needs ``$SPARK_JOBS_LAKE`` (or ``[lake_view] lake_root`` in airflow.cfg) on the API server.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from lake_view.app import app

URL_PREFIX = "/lake"


class LakeViewPlugin(AirflowPlugin):
    """Read-only pages over the pipelines' Delta tables, behind Airflow's login."""

    name = "lake_view"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Lake"}]  # noqa: RUF012 (AirflowPlugin's own attribute)
    # url_route embeds the page in the UI (same origin: the login cookie applies); href is relative to the UI's base URL
    external_views = [{"name": "Lake", "href": "lake/", "destination": "nav", "url_route": "lake"}]  # noqa: RUF012
