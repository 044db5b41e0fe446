"""What keeps the UI safe to mount in Airflow: authorization, CSRF and the response headers.

* **Roles.** A Starlette mount inherits none of Airflow's per-route auth, so the app depends
  on Airflow's ``requires_access_view(AccessView.PLUGINS)`` (a valid Airflow JWT, as a
  ``Authorization: Bearer`` header or the UI's ``_token`` cookie) and on
  :data:`require_read_access`. Reading needs permission to read the DAG
  ``document_pipeline``; changing the work list (assign, ignore) needs permission to edit
  it, and a redrive permission to trigger it, all asked through the auth manager's DAG
  authorization (SimpleAuthManager: viewer reads, user, op and admin change) (ADR 0008).
* **CSRF.** The UI cookie authenticates plugin requests, so a page on another origin could
  make a browser post to us with it. Every POST that is not authenticated by a (non-blank)
  bearer token must carry an ``Origin`` (or, failing that, ``Referer``) whose scheme, host
  and port are the request's own or those of ``[api] base_url`` (ADR 0015).
* **Headers.** :data:`SECURITY_HEADERS` go on every answer: no script may run, framing only
  by Airflow's own origin, nothing cached.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from typing import Annotated, Literal
from urllib.parse import urlsplit

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.auth.managers.models.resource_details import (
    DagAccessEntity,
    DagDetails,
)
from airflow.api_fastapi.core_api.security import GetUserDep, bearer_scheme
from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials

from replayable import config
from replayable.vocabulary import PIPELINE_DAG_ID

# No script at all: an injected tag cannot run even if escaping were ever lost. Framing is
# limited to Airflow's own origin, where the UI shows this page in an iframe. Pages hold
# ledger data behind a login: no cache keeps them.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "SAMEORIGIN",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}

Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an absolute http(s) URL, default ports filled in; else None."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or (443 if scheme == "https" else 80)


def _allowed_origins(request: Request) -> set[tuple[str, str, int]]:
    own = _origin(f"{request.url.scheme}://{request.headers.get('host', '')}")
    allowed = {own} if own else set()
    if (base_url := config.api_base_url()) and (configured := _origin(base_url)):
        allowed.add(configured)
    return allowed


def require_same_origin(request: Request, bearer: Bearer) -> None:
    """Refuse a cookie-authenticated POST that a page on another origin made (CSRF).

    Airflow's ``get_user`` reads this same ``bearer_scheme``: only when it yields a token
    (scheme ``Bearer`` and a non-blank value) is the cookie unused, and a browser never adds
    such a header by itself. A blank ``Authorization: Bearer`` falls back to the cookie, so
    it is checked like any other cookie request.
    """
    if bearer is not None and bearer.scheme.lower() == "bearer" and bearer.credentials.strip():
        return
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    # "null" (a sandboxed or privacy-stripped origin) is no origin and is refused too.
    if _origin(source) not in _allowed_origins(request):
        raise HTTPException(
            HTTPStatus.FORBIDDEN, "cross-origin request refused (Origin/Referer scheme and host)"
        )


def _dag_details() -> DagDetails:
    team = None
    if config.multi_team():
        # Only multi-team deployments tie a DAG to a team; the lookup needs the metadata DB.
        from airflow.models.dag import DagModel

        team = DagModel.get_team_name(PIPELINE_DAG_ID)
    return DagDetails(id=PIPELINE_DAG_ID, team_name=team)


def _require_dag(
    method: Literal["GET", "PUT", "POST"], entity: DagAccessEntity | None = None
) -> Callable[[GetUserDep], None]:
    def check(user: GetUserDep) -> None:
        if not get_auth_manager().is_authorized_dag(
            method=method, access_entity=entity, details=_dag_details(), user=user
        ):
            raise HTTPException(HTTPStatus.FORBIDDEN, "Forbidden")

    return check


# Reading the ledger of document_pipeline is reading the DAG; changing its work list is
# editing it; a redrive triggers a run of it, as Airflow's own trigger route asks.
require_read_access = _require_dag("GET")
require_edit_access = _require_dag("PUT")
require_trigger_access = _require_dag("POST", DagAccessEntity.RUN)


def callers_token(request: Request, bearer: Bearer) -> str:
    """The JWT this request was authenticated with, chosen as Airflow's ``get_user`` chooses.

    A redrive forwards it to Airflow's REST API, so that the run is the caller's own: never a
    service account's (ADR 0062).
    """
    if bearer is not None and bearer.scheme.lower() == "bearer":
        return bearer.credentials
    token = request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    if not token:
        raise HTTPException(HTTPStatus.UNAUTHORIZED, "Not authenticated")
    return token
