"""The Replayable UI inside Airflow: ledger overview, failed items, the dead-letter work list,
and a search of the pipeline's output.

:func:`create_app` builds a FastAPI app that the plugin mounts on the API server. It serves
HTML pages (:mod:`.pages`, shown in an iframe at ``/plugin/replayable``), the same data as
JSON under ``api/`` (:mod:`.api`), the work list's changes (:mod:`.actions`), the search
(:mod:`.search`) and ``/metrics`` (:mod:`.metrics`). What keeps it safe to mount (ADR 0008,
0015):

* every route needs an Airflow login and permission to read ``document_pipeline``; changes
  need more, and a cross-origin post is refused (:mod:`.security`);
* templates escape every value, and no page carries or may run a script (:mod:`.render`,
  :data:`.security.SECURITY_HEADERS`);
* a small pool with a statement timeout, read-only transactions for reads
  (:mod:`.database`, :mod:`.pool`); each change is recorded, with its actor, in the
  letter's history.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import psycopg2.errors
from airflow.api_fastapi.auth.managers.models.resource_details import AccessView
from airflow.api_fastapi.core_api.security import requires_access_view
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response

from replayable import config
from replayable.web import actions, api, pages
from replayable.web.database import default_dsn, ledger_dsn, schema_missing, too_slow
from replayable.web.metrics import router as metrics_router
from replayable.web.pool import ConnectionPool
from replayable.web.search import SEARCHES_AT_ONCE
from replayable.web.security import SECURITY_HEADERS, require_read_access


def create_app(
    dsn_provider: Callable[[], str] | None = None,
    *,
    pool_size: int | None = None,
    statement_timeout_s: float | None = None,
    openapi_url: str | None = None,
    airflow_api_url: str | None = None,
    ledger_dsn_provider: Callable[[], str] | None = None,
) -> FastAPI:
    """Build the UI app; ``dsn_provider`` returns the replayable database's DSN.

    By default the DSN comes from the Airflow connection ``replayable_ui_db``, else
    ``replayable_db``; the pool holds
    ``[replayable] ui_pool_size`` connections (4) and statements are cancelled after
    ``[replayable] ui_statement_timeout_s`` (5 s); both are Airflow config options, e.g.
    ``AIRFLOW__REPLAYABLE__UI_STATEMENT_TIMEOUT_S``. ``openapi_url`` serves the schema: for
    tests only, since Airflow's auth does not cover the docs routes. ``airflow_api_url`` is
    where a redrive reaches Airflow's REST API (see :func:`.redrive.airflow_api_root` for
    the default). ``ledger_dsn_provider`` returns the DSN a search writes through (its request
    budget, its model call's record, an index's first build): by default the Airflow
    connection ``replayable_db``'s, whatever the pool's role. Building the app touches
    neither Airflow's auth manager nor any database, so the plugin loads cheaply in every
    Airflow process.
    """
    app = FastAPI(
        title="Replayable",
        # Plugin mounts get none of Airflow's auth: every route requires it here.
        dependencies=[
            Depends(requires_access_view(AccessView.PLUGINS)),
            Depends(require_read_access),
        ],
        docs_url=None,
        redoc_url=None,
        openapi_url=openapi_url,
    )
    app.state.pool = ConnectionPool(
        dsn_provider or default_dsn,
        size=pool_size or config.ui_pool_size(),
        statement_timeout_s=statement_timeout_s or config.ui_statement_timeout_s(),
    )
    app.state.airflow_api_url = airflow_api_url
    app.state.ledger_dsn_provider = ledger_dsn_provider or ledger_dsn
    app.state.searches = anyio.CapacityLimiter(SEARCHES_AT_ONCE)
    # In this order, as one router served them before the split: the schema lists them so.
    app.include_router(pages.router)
    app.include_router(actions.router)
    app.include_router(api.router)
    app.include_router(metrics_router)  # its own auth: Airflow's or the scrape token
    app.add_exception_handler(psycopg2.errors.UndefinedTable, schema_missing)
    app.add_exception_handler(psycopg2.errors.QueryCanceled, too_slow)

    @app.middleware("http")
    async def security_headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        return response

    return app
