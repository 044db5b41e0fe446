"""Postgres access: connections, SQL files and schema migrations.

SQL lives in ``replayable/sql``: ``migrations/NNNN_name.sql`` (applied in order, each once)
and ``queries/name.sql`` (loaded by name, with psycopg2 ``%(name)s`` placeholders so that
every value is bound by the driver).
"""

from __future__ import annotations

import functools
import logging
from importlib import resources
from typing import Any

import psycopg2
import psycopg2.extras

log = logging.getLogger(__name__)

# psycopg2 ships no type information; this alias names what the functions expect.
Connection = Any

# Any fixed number works; it only has to be the same for every migrator.
_MIGRATION_LOCK = 0x5245504C


def connect(dsn: str, *, autocommit: bool = False) -> Connection:
    """Open a psycopg2 connection to ``dsn`` (a libpq URI or key=value string)."""
    conn = psycopg2.connect(dsn, application_name="replayable")
    conn.autocommit = autocommit
    return conn


@functools.cache
def sql(name: str) -> str:
    """Return the text of ``sql/queries/<name>.sql``."""
    return resources.files("replayable").joinpath("sql", "queries", f"{name}.sql").read_text()


def fetch_all(conn: Connection, query: str, params: Any = None) -> list[dict[str, Any]]:
    """Run a named query (see :func:`sql`) and return its rows as dicts."""
    with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute(sql(query), params)
        return [dict(row) for row in cur.fetchall()]


def execute(conn: Connection, query: str, params: Any = None) -> int:
    """Run a named statement and return its row count."""
    with conn.cursor() as cur:
        cur.execute(sql(query), params)
        return int(cur.rowcount)


def execute_values(
    conn: Connection, query: str, rows: list[tuple[Any, ...]], template: str | None = None
) -> None:
    """Run a named ``INSERT … VALUES %s`` statement over many rows in few round trips."""
    if rows:
        with conn.cursor() as cur:
            psycopg2.extras.execute_values(cur, sql(query), rows, template=template, page_size=500)


def _migrations() -> list[tuple[str, str]]:
    folder = resources.files("replayable").joinpath("sql", "migrations")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return [(f.name.removesuffix(".sql"), f.read_text()) for f in files]


def migrate(conn: Connection) -> list[str]:
    """Apply the migrations this database lacks, in order; return the names applied.

    Safe to call from many tasks at once: an advisory lock serialises them, and each
    migration is idempotent on its own as well.
    """
    applied: list[str] = []
    with conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            cur.execute(
                "CREATE SCHEMA IF NOT EXISTS replayable;"
                "CREATE TABLE IF NOT EXISTS replayable.schema_migrations ("
                " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.commit()
            cur.execute("SELECT version FROM replayable.schema_migrations")
            done = {row[0] for row in cur.fetchall()}
            for version, text in _migrations():
                if version in done:
                    continue
                cur.execute(text)
                cur.execute(
                    "INSERT INTO replayable.schema_migrations (version) VALUES (%s)"
                    " ON CONFLICT DO NOTHING",
                    (version,),
                )
                conn.commit()
                applied.append(version)
                log.info("applied migration %s", version)
        finally:
            conn.rollback()
            cur.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
            conn.commit()
    return applied
