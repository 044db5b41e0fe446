"""The UI's database: which one, a pooled connection per request, and the answers on failure.

Routes take :data:`ReadConn` (a read-only transaction: a read route cannot write) or
:data:`WriteConn` (rolled back unless the route commits). Both come from the app's pool
(:mod:`.pool`), which refuses at once when every connection is taken (ADR 0073). Whatever
goes wrong with the database, the person looking at the page gets a 503 that names no
address; the details go to the API server's log.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from http import HTTPStatus
from typing import Annotated

import psycopg2
import psycopg2.errors
from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from replayable import db
from replayable.vocabulary import LEDGER_CONN_ID
from replayable.web.pool import RETRY_AFTER_S, ConnectionPool, PoolBusyError

log = logging.getLogger(__name__)

# The UI's own least-privilege connection (see the README), used instead when it exists.
UI_DSN_CONN_ID = "replayable_ui_db"


def default_dsn() -> str:
    """The DSN of ``replayable_ui_db`` (a least-privilege role, see the README), else ours."""
    # Imported here: replayable.airflow.hooks loads the task SDK, which only this path needs.
    from airflow.sdk.exceptions import AirflowNotFoundException

    from replayable.airflow.hooks import connection_dsn

    try:
        return connection_dsn(UI_DSN_CONN_ID)
    except AirflowNotFoundException:
        return connection_dsn(LEDGER_CONN_ID)


def ledger_dsn() -> str:
    """The DSN of ``replayable_db``: a search writes there what the UI's role may not (its
    request budget, its model call's record, an index's first build; see :mod:`.search`)."""
    from replayable.airflow.hooks import connection_dsn

    return connection_dsn(LEDGER_CONN_ID)


@contextlib.contextmanager
def pooled(pool: ConnectionPool, *, readonly: bool) -> Iterator[db.Connection]:
    """A connection of ``pool``; 503 if there is none to have, at once if all are busy."""
    try:
        with pool.connection(readonly=readonly) as conn:
            yield conn
    # A missing Airflow connection or an unreachable server both mean the same to the
    # person looking at the page; the details go to the API server's log.
    except psycopg2.OperationalError as err:
        if isinstance(err, psycopg2.errors.QueryCanceled):
            raise
        log.warning("replayable UI cannot reach its database: %s", err)
        raise unavailable() from err
    except psycopg2.InterfaceError as err:
        log.warning("replayable UI has no database connection: %s", err)
        raise unavailable() from err
    except PoolBusyError as err:
        log.warning("replayable UI refused a request: %s", err)
        raise HTTPException(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"All {pool.size} of the UI's database connections are busy; try again in a moment.",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        ) from err


def unavailable() -> HTTPException:
    """The 503 of a replayable database that cannot be reached; it names no address."""
    return HTTPException(
        HTTPStatus.SERVICE_UNAVAILABLE,
        f"The replayable database is unavailable; check the Airflow connection {LEDGER_CONN_ID!r}.",
    )


def _connection(request: Request, *, readonly: bool) -> Iterator[db.Connection]:
    # No request waits for a connection in a worker thread: see replayable.web.pool.
    with pooled(request.app.state.pool, readonly=readonly) as conn:
        yield conn


def read_connection(request: Request) -> Iterator[db.Connection]:
    """A connection in a read-only transaction: a read route cannot write."""
    yield from _connection(request, readonly=True)


def write_connection(request: Request) -> Iterator[db.Connection]:
    """A connection in a read-write transaction, rolled back unless the route commits."""
    yield from _connection(request, readonly=False)


ReadConn = Annotated[db.Connection, Depends(read_connection)]
WriteConn = Annotated[db.Connection, Depends(write_connection)]


def _refusal(status: HTTPStatus, detail: str) -> Response:
    return JSONResponse({"detail": detail}, status)


async def schema_missing(request: Request, exc: Exception) -> Response:
    """The answer when the database has no replayable schema yet (an exception handler)."""
    return _refusal(
        HTTPStatus.SERVICE_UNAVAILABLE,
        "The replayable database has no replayable schema yet; run the pipeline once (or "
        "`make start`) to create it.",
    )


async def too_slow(request: Request, exc: Exception) -> Response:
    """The answer when the statement timeout cancelled a query (an exception handler)."""
    seconds = request.app.state.pool.statement_timeout_s
    return _refusal(
        HTTPStatus.SERVICE_UNAVAILABLE,
        f"The query took longer than {seconds:g} s and was cancelled; try a smaller page.",
    )
