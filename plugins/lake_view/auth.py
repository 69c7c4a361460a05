"""Airflow authentication for the lake view: the same checks as Airflow's own REST API.

Airflow does not authenticate plugin FastAPI apps, so every route depends on :func:`airflow_user`: the ``_token``
cookie the Airflow UI sets at login, or ``Authorization: Bearer <token>`` from ``POST /auth/token``, goes through
Airflow's ``get_user``, the dependency its plugin documentation gives plugin apps (the header wins; a cookie the
refresh middleware renewed is taken as it left it; the auth manager checks signature, expiry and revocation), then
the auth manager's ``is_authorized_custom_view`` on the ``Lake`` resource. Airflow is imported only when a request
arrives, so importing the plugin stays cheap in the scheduler and the DAG processor (Airflow 3.3's
``core_api.security`` alone costs seconds and about 100 MB): hence ``get_user`` is called, not declared with
``Depends``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials

if TYPE_CHECKING:
    from airflow.api_fastapi.auth.managers.base_auth_manager import BaseAuthManager
    from airflow.api_fastapi.auth.managers.models.base_user import BaseUser

__all__ = ["RESOURCE_NAME", "NotAuthenticated", "airflow_user", "login_url"]

RESOURCE_NAME = "Lake"


class NotAuthenticated(Exception):
    """No valid Airflow token: pages redirect to the login page, the JSON API answers 401."""


def _auth_manager() -> BaseAuthManager:
    """The API server's auth manager (``RuntimeError`` outside an API server). Airflow 3.3 has no public accessor
    for plugin apps: its routes read the root app's ``app.state.auth_manager``, which a mounted app cannot reach,
    and the auth-manager providers (FAB, Keycloak) call this same ``get_auth_manager``."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager()


async def airflow_user(request: Request) -> BaseUser:
    """The Airflow user behind the request, or :class:`NotAuthenticated` / 403."""
    # the cookie's name is public: Airflow 3.3's auth-manager documentation has auth managers set it
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    # the Bearer credentials as FastAPI's HTTPBearer reads them for get_user
    bearer = (HTTPAuthorizationCredentials(scheme=scheme, credentials=credentials.strip())
              if scheme.lower() == "bearer" and credentials.strip() else None)
    if bearer is None and not request.cookies.get(COOKIE_NAME_JWT_TOKEN):
        raise NotAuthenticated("not authenticated: log in to Airflow, or send Authorization: Bearer <token> "
                               "(POST /auth/token)")
    from airflow.api_fastapi.core_api.security import get_user

    try:
        user = await get_user(request, None, bearer)  # (request, OAuth2 form token: unused, bearer credentials)
    except HTTPException as exc:  # 401 expired / 403 invalid signature: either way, log in again
        raise NotAuthenticated(f"{exc.detail}: log in to Airflow again") from None
    if not _auth_manager().is_authorized_custom_view(method="GET", resource_name=RESOURCE_NAME, user=user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"user {user.get_name()!r} may not read the {RESOURCE_NAME} view")
    return user


def login_url(next_url: str) -> str:
    """Airflow's login page, coming back to ``next_url`` afterwards."""
    return _auth_manager().get_url_login(next_url=next_url)
