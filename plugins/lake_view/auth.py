"""Airflow authentication for the lake view: the same JWT checks as Airflow's own REST API.

Airflow does not protect plugin FastAPI apps, so every route of the lake view depends on
:func:`airflow_user`. A request authenticates with the ``_token`` cookie the Airflow UI sets
at login, or with ``Authorization: Bearer <token>`` from ``POST /auth/token``; the token is
validated by the running auth manager (``get_user_from_token``: signature, expiry,
revocation), and the user must be allowed to read custom views (``is_authorized_custom_view``).
Airflow is imported only when a request arrives, so importing the plugin stays cheap in the
scheduler and the DAG processor.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request, status

__all__ = ["RESOURCE_NAME", "NotAuthenticated", "airflow_user", "login_url"]

RESOURCE_NAME = "Lake"


class NotAuthenticated(Exception):
    """No valid Airflow token: pages redirect to the login page, the JSON API answers 401."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _token(request: Request) -> tuple[str | None, bool]:
    """(token, from_header): an explicit Bearer header wins over the session cookie, as in Airflow."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN

    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip(), True
    return request.cookies.get(COOKIE_NAME_JWT_TOKEN), False


async def airflow_user(request: Request) -> Any:
    """The Airflow user behind the request, or :class:`NotAuthenticated` / 403."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.core_api.security import USER_INJECTED_BY_TRUSTED_MIDDLEWARE, resolve_user_from_token

    token, from_header = _token(request)
    user = None
    if not from_header:
        # Airflow's JWTRefreshMiddleware may have validated (and refreshed) the cookie already
        state_user = getattr(request.state, "user", None)
        if state_user is not None and getattr(request.state, "user_authenticated_via", None) \
                is USER_INJECTED_BY_TRUSTED_MIDDLEWARE:
            user = state_user
    if user is None:
        if not token:
            raise NotAuthenticated("not authenticated: log in to Airflow, or send Authorization: Bearer <token> "
                                   "(POST /auth/token)")
        try:
            user = await resolve_user_from_token(token)
        except HTTPException as exc:  # 401 expired / 403 invalid signature: either way, log in again
            raise NotAuthenticated(f"{exc.detail}: log in to Airflow again") from None
    if not get_auth_manager().is_authorized_custom_view(method="GET", resource_name=RESOURCE_NAME, user=user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"user {user.get_name()!r} may not read the {RESOURCE_NAME} view")
    return user


def login_url(next_url: str) -> str:
    """Airflow's login page, coming back to ``next_url`` afterwards."""
    from airflow.api_fastapi.app import get_auth_manager

    return get_auth_manager().get_url_login(next_url=next_url)
