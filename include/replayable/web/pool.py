"""A small, thread-safe pool of database connections for the UI, with a statement timeout.

The UI runs inside Airflow's API server, next to the scheduler's own use of the database: a
few viewers must not be able to take every connection or hold one with a slow query. So the
UI keeps at most ``size`` connections (a request waits up to ``wait_s`` for one, then gets
503), every statement is cancelled after ``statement_timeout_s``, and each request gets a
transaction that is read-only unless the route changes the work list (ADR 0015).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

import psycopg2
import psycopg2.extensions

from replayable.db import Connection

log = logging.getLogger(__name__)


class PoolBusyError(Exception):
    """Every connection stayed in use for longer than the pool's ``wait_s``."""


class ConnectionPool:
    """At most ``size`` connections to the DSN that ``dsn_provider`` returns.

    Connections are opened when needed (so building the pool touches no database), kept idle
    for the next request, and dropped when they break. The DSN is asked for whenever a new
    connection is opened, so a changed Airflow connection applies to new connections.

    :param dsn_provider: returns the libpq DSN of the replayable database.
    :param size: the most connections open at once.
    :param statement_timeout_s: every statement is cancelled after this long.
    :param wait_s: how long a request waits for a free connection.
    """

    def __init__(
        self,
        dsn_provider: Callable[[], str],
        *,
        size: int = 4,
        statement_timeout_s: float = 5.0,
        wait_s: float = 10.0,
    ) -> None:
        if size < 1:
            raise ValueError(f"size: must be at least 1, got {size!r}")
        if statement_timeout_s <= 0:
            raise ValueError(f"statement_timeout_s: must be positive, got {statement_timeout_s!r}")
        self.dsn_provider = dsn_provider
        self.size = size
        self.statement_timeout_s = statement_timeout_s
        self.wait_s = wait_s
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _open(self) -> Connection:
        timeout_ms = max(1, round(self.statement_timeout_s * 1000))
        # Session settings travel in the startup packet: no statement, no round trip. An
        # abandoned transaction is ended by the server too.
        options = (
            f"-c statement_timeout={timeout_ms} "
            f"-c idle_in_transaction_session_timeout={max(timeout_ms * 2, 10_000)}"
        )
        return psycopg2.connect(
            self.dsn_provider(), application_name="replayable-ui", options=options
        )

    @contextlib.contextmanager
    def connection(self, *, readonly: bool) -> Iterator[Connection]:
        """A connection in a fresh transaction (read-only if ``readonly``), for one request.

        The transaction is rolled back afterwards unless the caller committed it.
        """
        if not self._slots.acquire(timeout=self.wait_s):
            raise PoolBusyError(f"all {self.size} database connections stayed busy")
        conn: Connection | None = None
        try:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._open()
            # REPEATABLE READ: the several queries of one page see one snapshot.
            conn.set_session(
                isolation_level=psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ
                if readonly
                else psycopg2.extensions.ISOLATION_LEVEL_READ_COMMITTED,
                readonly=readonly,
                autocommit=False,
            )
            yield conn
        finally:
            if conn is not None:
                self._give_back(conn)
            self._slots.release()

    def _give_back(self, conn: Connection) -> None:
        try:
            if not conn.closed:
                conn.rollback()
        except psycopg2.Error as error:
            log.info("dropping a broken UI database connection: %s", error)
            conn.close()
        with self._lock:
            if not conn.closed and not self._closed:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (those in use are closed when given back after this)."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._closed = True
        for conn in idle:
            conn.close()
