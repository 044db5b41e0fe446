"""A small, thread-safe pool of database connections for the UI, with a statement timeout.

The UI runs inside Airflow's API server, next to the scheduler's own use of the database: a
few viewers must not be able to take every connection or hold one with a slow query. So the
UI keeps at most ``size`` connections, every statement is cancelled after
``statement_timeout_s``, and each request gets a transaction that is read-only unless the
route changes the work list (ADR 0015).

A request that finds every connection taken is refused at once (the UI answers 503 with
``Retry-After``), never made to wait (ADR 0073): it would wait in one of the API server's
worker threads, the same few dozen that run Airflow's own sync routes, task heartbeats
among them, and a burst of page loads would starve those.
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

# What a refused request is told to wait: a page holds its connection for milliseconds, or
# at worst for a statement timeout, so a second is the usual wait and never a long one.
RETRY_AFTER_S = 1


class PoolBusyError(Exception):
    """Every connection was in use when a request asked for one."""


class ConnectionPool:
    """At most ``size`` connections to the DSN that ``dsn_provider`` returns.

    Connections are opened when needed (so building the pool touches no database), kept idle
    for the next request, and dropped when they break. The DSN is asked for whenever a new
    connection is opened, so a changed Airflow connection applies to new connections. When
    all ``size`` are taken, :meth:`connection` raises :class:`PoolBusyError` without waiting.

    :param dsn_provider: returns the libpq DSN of the replayable database.
    :param size: the most connections open at once.
    :param statement_timeout_s: every statement is cancelled after this long.
    """

    def __init__(
        self,
        dsn_provider: Callable[[], str],
        *,
        size: int = 4,
        statement_timeout_s: float = 5.0,
    ) -> None:
        if size < 1:
            raise ValueError(f"size: must be at least 1, got {size!r}")
        if statement_timeout_s <= 0:
            raise ValueError(f"statement_timeout_s: must be positive, got {statement_timeout_s!r}")
        self.dsn_provider = dsn_provider
        self.size = size
        self.statement_timeout_s = statement_timeout_s
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._taken = 0

    @property
    def in_use(self) -> int:
        """How many connections are handed out right now."""
        with self._lock:
            return self._taken

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

        :raises PoolBusyError: every connection is taken (at once: see the module's docstring).
        """
        if not self._slots.acquire(blocking=False):
            raise PoolBusyError(f"all {self.size} database connections are busy")
        with self._lock:
            self._taken += 1
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
            with self._lock:
                self._taken -= 1
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
