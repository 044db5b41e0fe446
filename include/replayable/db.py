"""Postgres access: connections, SQL files and schema migrations.

SQL lives in ``replayable/sql``: ``migrations/NNNN_name.sql`` (applied in order, each once)
and ``queries/<topic>/name.sql`` (loaded as ``"topic/name"``, with psycopg2 ``%(name)s``
placeholders so that every value is bound by the driver). The topics are what a query is
about, not who calls it: ``ledger``, ``plan``, ``stages``, ``report``, ``views``, ``metrics``,
``outbox``, ``budget``, ``dead_letters``, ``check`` (the ledger's invariants).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from importlib import resources
from typing import Any, TypeVar

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras

log = logging.getLogger(__name__)

# psycopg2 ships no type information; this alias names what the functions expect.
Connection = Any

T = TypeVar("T")

# Any fixed number works; it only has to be the same for every migrator.
_MIGRATION_LOCK = 0x5245504C
# How long one migration statement may wait for a lock, and how often a migrator tries.
MIGRATION_LOCK_TIMEOUT_S = 5.0
MIGRATION_ATTEMPTS = 3


def connect(dsn: str, *, autocommit: bool = False) -> Connection:
    """Open a psycopg2 connection to ``dsn`` (a libpq URI or key=value string)."""
    conn = psycopg2.connect(dsn, application_name="replayable")
    conn.autocommit = autocommit
    return conn


@functools.cache
def sql(name: str) -> str:
    """Return the text of ``sql/queries/<topic>/<name>.sql`` for ``name`` = ``"topic/name"``."""
    topic, sep, query = name.partition("/")
    if not sep or not topic or not query or "/" in query:
        raise ValueError(f"a query is named 'topic/name', not {name!r}")
    return (
        resources.files("replayable").joinpath("sql", "queries", topic, f"{query}.sql").read_text()
    )


class DatabaseUnavailableError(Exception):
    """The database could not be reached for longer than the outage budget."""


def connection_lost(conn: Connection | None, error: BaseException) -> bool:
    """Whether ``error`` means the connection (or the server) went away, not a bad statement."""
    if isinstance(error, psycopg2.InterfaceError):
        return True
    if not isinstance(error, psycopg2.OperationalError):
        return False
    if isinstance(error, psycopg2.errors.QueryCanceled):
        return False  # statement_timeout: the statement's fault, not the connection's
    return conn is None or bool(conn.closed) or isinstance(error, psycopg2.errors.AdminShutdown)


def _retryable(conn: Connection | None, error: BaseException) -> bool:
    # A deadlock or serialization failure rolls the transaction back; running it again is
    # the documented remedy.
    return connection_lost(conn, error) or isinstance(
        error, psycopg2.extensions.TransactionRollbackError
    )


class Database:
    """One connection that outlives a database restart.

    :meth:`transaction` runs a function and commits; when the connection is lost (or a
    deadlock rolls the transaction back) it reconnects and runs the whole function again,
    with backoff, until ``outage_s`` has passed, then raises DatabaseUnavailableError. The
    function must therefore be safe to run twice, as every keyed write here is.
    """

    def __init__(
        self,
        dsn: str,
        *,
        outage_s: float = 300.0,
        autocommit: bool = False,
        connector: Callable[[], Connection] | None = None,
    ) -> None:
        self.dsn = dsn
        self.outage_s = outage_s
        self.autocommit = autocommit
        self._connector = connector or (lambda: connect(self.dsn))
        self._conn: Connection | None = None

    @property
    def conn(self) -> Connection:
        """The live connection, opened on first use (may raise psycopg2 errors)."""
        if self._conn is None or self._conn.closed:
            self._conn = self._connector()
            self._conn.autocommit = self.autocommit
        return self._conn

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None

    def transaction(self, fn: Callable[[Connection], T], *, describe: str = "statement") -> T:
        """Return ``fn(conn)`` after committing it; retried whole across lost connections."""
        started = time.monotonic()
        tries = 0
        while True:
            conn: Connection | None = None
            try:
                conn = self.conn
                result = fn(conn)
                if not conn.autocommit:
                    conn.commit()
                return result
            except Exception as error:
                if conn is not None and not conn.closed:
                    try:
                        conn.rollback()
                    except psycopg2.Error:
                        self.close()
                if not _retryable(conn, error):
                    raise
                self.close()
                tries += 1
                elapsed = time.monotonic() - started
                if elapsed > self.outage_s:
                    raise DatabaseUnavailableError(
                        f"{describe}: the database was unreachable for {elapsed:.0f} s "
                        f"(last error: {type(error).__name__}: {str(error).strip()})"
                    ) from error
                wait = random.uniform(0, min(5.0, 0.1 * 2**tries))  # noqa: S311 - jitter
                log.warning(
                    "%s: database connection lost (%s); retrying in %.1f s",
                    describe,
                    type(error).__name__,
                    wait,
                )
                time.sleep(wait)


def fetch_all(conn: Connection, query: str, params: Any = None) -> list[dict[str, Any]]:
    """Run a named query (see :func:`sql`) and return its rows as dicts."""
    with conn.cursor() as cur:
        cur.execute(sql(query), params)
        return dict_rows(cur)


def execute(conn: Connection, query: str, params: Any = None) -> int:
    """Run a named statement and return its row count."""
    with conn.cursor() as cur:
        cur.execute(sql(query), params)
        return int(cur.rowcount)


def values_statement(
    conn: Connection, query: str, rows: list[tuple[Any, ...]], template: str | None = None
) -> bytes:
    """A named ``INSERT … VALUES %s`` query with every row bound, as one statement.

    For :func:`fetch_script`, which sends several statements in one round trip.
    """
    head, tail = sql(query).split("%s", 1)
    shape = template or "(" + ",".join(["%s"] * len(rows[0])) + ")"
    with conn.cursor() as cur:
        values = b",".join(cur.mogrify(shape, row) for row in rows)
    return head.encode() + values + tail.encode()


def fetch_script(
    conn: Connection, before: list[bytes], query: str, params: Any = None
) -> list[dict[str, Any]]:
    """Run bound statements, then a named query, in one round trip; return the query's rows.

    On an autocommit connection Postgres runs the whole string as one transaction: either
    every statement takes effect or none does.
    """
    with conn.cursor() as cur:
        last = cur.mogrify(sql(query), params)
        cur.execute(b";\n".join([*before, last]))
        return dict_rows(cur)


def dict_rows(cur: Any) -> list[dict[str, Any]]:
    """The executed cursor's rows as dicts, built from plain tuples: a RealDictCursor sets
    each column of each row from Python, which cost 3 ms of a 500-item claim's 45 (B3)."""
    names = [column.name for column in cur.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def execute_values(
    conn: Connection, query: str, rows: list[tuple[Any, ...]], template: str | None = None
) -> None:
    """Run a named ``INSERT … VALUES %s`` statement over many rows in few round trips."""
    if rows:
        with conn.cursor() as cur:
            psycopg2.extras.execute_values(cur, sql(query), rows, template=template, page_size=500)


# Migrations that took a new number (ADR 0158), by the name databases recorded them under: a
# database that applied the old name has applied the new one. A file is renamed only here.
RENAMED_MIGRATIONS = {"0003_request_rates": "0031_request_rates"}


def _migrations() -> list[tuple[str, str]]:
    folder = resources.files("replayable").joinpath("sql", "migrations")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return [(f.name.removesuffix(".sql"), f.read_text()) for f in files]


def _applied(cur: Any) -> set[str]:
    """The migrations ``schema_migrations`` records, renamed ones under their current name."""
    cur.execute("SELECT version FROM replayable.schema_migrations")
    return {RENAMED_MIGRATIONS.get(row[0], row[0]) for row in cur.fetchall()}


class MigrationLockTimeout(Exception):
    """A migration waited for a lock longer than its budget, on every attempt."""


def _pending(conn: Connection) -> list[str]:
    """The migrations this database lacks, read without taking any lock a migrator holds."""
    with conn.cursor() as cur:
        cur.execute("SELECT to_regclass('replayable.schema_migrations') IS NOT NULL")
        (exists,) = cur.fetchone()
        done = _applied(cur) if exists else set()
    conn.commit()
    return [version for version, _ in _migrations() if version not in done]


def migrate(
    conn: Connection,
    *,
    lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S,
    attempts: int = MIGRATION_ATTEMPTS,
) -> list[str]:
    """Apply the migrations this database lacks, in order; return the names applied.

    Every ``plan`` calls this, so a schema that is up to date is only read: no lock is
    taken, and a stuck migrator holds up no run (ADR 0075). Otherwise an advisory lock
    lets one migrator at a time apply what is still missing (each migration is idempotent
    on its own as well), and every statement, taking that lock included, waits at most
    ``lock_timeout_s`` for a lock: DDL queued behind a long transaction would queue every
    reader of its table behind itself. On a timeout the attempt is rolled back and retried
    after a jittered pause; after ``attempts`` it raises :class:`MigrationLockTimeout`
    naming the migration, and the task's own retry tries again later.
    """
    if not _pending(conn):
        return []
    for attempt in range(1, attempts + 1):
        try:
            return _migrate_locked(conn, lock_timeout_s)
        except _LockWaitTimeout as timeout:
            if attempt == attempts:
                raise MigrationLockTimeout(
                    f"migration {timeout.version} waited more than {lock_timeout_s} s for a"
                    f" lock on each of {attempts} attempts (a long transaction on its tables,"
                    " or another migrator); nothing of it was applied"
                ) from timeout.__cause__
            time.sleep(random.uniform(0, lock_timeout_s * 2**attempt))  # noqa: S311 - jitter
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


class _LockWaitTimeout(Exception):
    """One attempt of ``migrate`` gave up waiting for a lock while on ``version``."""

    def __init__(self, version: str) -> None:
        super().__init__(version)
        self.version = version


def _migrate_locked(conn: Connection, lock_timeout_s: float) -> list[str]:
    """One attempt: take the migration lock, apply what is still missing, let go of the lock."""
    applied: list[str] = []
    step = "the migration lock"
    with conn.cursor() as cur:
        cur.execute("SELECT current_setting('lock_timeout')")
        (previous,) = cur.fetchone()
        cur.execute(
            "SELECT set_config('lock_timeout', %s, false)", (f"{int(lock_timeout_s * 1000)}ms",)
        )
        conn.commit()
        locked = False
        try:
            cur.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
            locked = True
            step = "replayable.schema_migrations"
            cur.execute(
                "CREATE SCHEMA IF NOT EXISTS replayable;"
                "CREATE TABLE IF NOT EXISTS replayable.schema_migrations ("
                " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.commit()
            done = _applied(cur)
            for version, text in _migrations():
                if version in done:
                    continue
                step = version
                cur.execute(text)
                cur.execute(
                    "INSERT INTO replayable.schema_migrations (version) VALUES (%s)"
                    " ON CONFLICT DO NOTHING",
                    (version,),
                )
                conn.commit()
                applied.append(version)
                log.info("applied migration %s", version)
        except psycopg2.errors.LockNotAvailable as error:
            raise _LockWaitTimeout(step) from error
        finally:
            conn.rollback()
            if locked:
                cur.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
            cur.execute("SELECT set_config('lock_timeout', %s, false)", (previous,))
            conn.commit()
    return applied
