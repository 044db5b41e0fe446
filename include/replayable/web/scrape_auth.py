"""Who may scrape ``/replayable/metrics``: an Airflow user, or the scrape token (ADR 0071).

Like every route of the app, the metrics endpoint lets in a request with an Airflow JWT
(bearer or the UI cookie) of a user allowed to see plugins. A Prometheus server has no
Airflow login, so the endpoint also takes a scrape token: the Airflow Variable
``replayable_metrics_token`` (:data:`TOKEN_VARIABLE`), sent as ``Authorization: Bearer
<token>`` and compared in constant time. Without the Variable only Airflow's auth applies;
an anonymous request gets 401.

The metrics route is a plain Starlette route, not an ``APIRoute``: the app-wide Airflow
dependency would refuse the scrape token as a malformed JWT before any route code ran, so
the route checks both ways itself (:func:`authorize`) and never answers before one has
passed. Reading the Variable costs a metadata-database query (or a secrets-backend call),
so no request can cause one on its own: a bearer shaped like a JWT goes to Airflow first
and reads no Variable when Airflow accepts it, and the token is read at most once per
:data:`TOKEN_TTL_S` per app, however many requests present a bearer. A changed token takes
effect within that time.
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from http import HTTPStatus
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import bearer_scheme, get_user
from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

TOKEN_VARIABLE = "replayable_metrics_token"  # noqa: S105 - a Variable's name, not a secret
TOKEN_TTL_S = 30.0  # how long a read of the Variable is trusted
# header.payload.signature, each base64url: what Airflow's JWTs look like.
_JWT_SHAPE = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")


def scrape_token() -> str | None:
    """The configured scrape token, or None when the Variable is unset or blank."""
    from airflow.sdk import Variable

    value = Variable.get(TOKEN_VARIABLE, default=None)
    if value is None:
        return None
    return str(value).strip() or None


class _CachedToken:
    """The scrape token, read from its Variable at most once per ``ttl_s``."""

    def __init__(self, ttl_s: float = TOKEN_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._value: str | None = None
        self._until = float("-inf")

    def get(self) -> str | None:
        # One reader at a time: requests that arrive while it reads wait for its answer.
        with self._lock:
            now = time.monotonic()
            if now >= self._until:
                self._value = scrape_token()
                self._until = now + self.ttl_s
            return self._value


def _token_cache(request: Request) -> _CachedToken:
    state = request.app.state
    cache = getattr(state, "scrape_token_cache", None)
    if cache is None:
        cache = state.scrape_token_cache = _CachedToken()
    return cache


async def _is_scrape_token(request: Request, presented: str) -> bool:
    expected = await run_in_threadpool(_token_cache(request).get)
    return expected is not None and hmac.compare_digest(presented.encode(), expected.encode())


async def _airflow_user_may_see(request: Request, credentials: Any) -> None:
    user = await get_user(request, None, credentials)
    if not get_auth_manager().is_authorized_view(access_view=AccessView.PLUGINS, user=user):
        raise HTTPException(HTTPStatus.FORBIDDEN, "Forbidden")


async def authorize(request: Request) -> None:
    """Let the request through with Airflow's own check or the scrape token; else raise.

    Authentication comes before any read of the Variable: a bearer shaped like a JWT, the
    UI cookie, or no credential at all is judged by Airflow as the rest of the app is
    (Airflow resolves the user: 401 without a credential, 403 for a bad one; the auth
    manager must allow the plugins view). Only a bearer that Airflow did not accept is
    compared, in constant time, with the scrape token, read through a per-app cache.
    """
    credentials = await bearer_scheme(request)
    presented = credentials.credentials if credentials is not None else None
    if presented is None or _JWT_SHAPE.match(presented):
        try:
            await _airflow_user_may_see(request, credentials)
        except HTTPException:
            if presented is None or not await _is_scrape_token(request, presented):
                raise
        return
    # Not a JWT: Airflow would only log it as invalid. Compare it; refuse as Airflow would.
    if await _is_scrape_token(request, presented):
        return
    await _airflow_user_may_see(request, credentials)
