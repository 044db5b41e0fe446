"""The tests' ledger: emptied between tests, and the rows most tests start from."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any
from unittest import mock

import psycopg2
from psycopg2 import sql

from devtools import devenv
from replayable import db


def scratch_database(dsn: str) -> None:
    """Stop the tests' own Postgres from flushing to disk: its data lives for one session.

    Commits still reach the kernel before they return, so a killed Postgres (a test's
    restart, an outage) loses nothing; only a crash of the machine could, and the session
    would be lost with it.
    """
    conn = db.connect(dsn, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("ALTER SYSTEM SET fsync = off")
            cur.execute("ALTER SYSTEM SET full_page_writes = off")
            cur.execute("SELECT pg_reload_conf()")
    finally:
        conn.close()


# Up to this many rows a table is emptied with DELETE, above it with TRUNCATE (see below).
_DELETE_UP_TO = 1000


def empty_ledger(conn: Any) -> None:
    """Empty the replayable schema as ``devenv.empty_ledger`` does, in a few milliseconds.

    TRUNCATE of every table costs about 0.2 s (a new file per table and index), paid before
    each of several hundred tests. Most tests leave a few tables with a few rows: those are
    emptied with DELETE, with triggers and foreign-key checks off for the transaction
    (``session_replication_role``), so that no trigger writes a counter or a history row
    while it empties, as with TRUNCATE. Large tables are truncated, so that no test scans a
    bloated table. Without the superuser right that setting needs, it falls back to
    ``devenv.empty_ledger``.
    """
    with conn.cursor() as cur:
        cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        superuser = bool(cur.fetchone()[0])
    if not superuser:
        devenv.empty_ledger(conn)
        return
    with conn.cursor() as cur:
        cur.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'replayable'"
            " AND tablename <> 'schema_migrations' ORDER BY tablename"
        )
        names = [row[0] for row in cur.fetchall()]
        if not names:
            conn.commit()
            return
        # Rows per table, counted up to one past the DELETE limit, in one statement.
        cur.execute(
            sql.SQL("SELECT ARRAY[{}]").format(
                sql.SQL(", ").join(
                    sql.SQL("(SELECT count(*) FROM (SELECT FROM {} LIMIT {}) AS t)").format(
                        sql.Identifier("replayable", name), sql.Literal(_DELETE_UP_TO + 1)
                    )
                    for name in names
                )
            )
        )
        counts = dict(zip(names, cur.fetchone()[0], strict=True))
        large = [name for name, n in counts.items() if n > _DELETE_UP_TO]
        small = [name for name, n in counts.items() if 0 < n <= _DELETE_UP_TO]
        if large:
            tables = sql.SQL(", ").join(sql.Identifier("replayable", n) for n in large)
            cur.execute(sql.SQL("TRUNCATE {} CASCADE").format(tables))
        if small:
            cur.execute("SET LOCAL session_replication_role = replica")
            for name in small:
                cur.execute(sql.SQL("DELETE FROM {}").format(sql.Identifier("replayable", name)))
    devenv.drop_search_indexes(conn)
    conn.commit()


def register_documents(conn: Any, doc_ids: Iterable[str], folder: str = "") -> list[str]:
    """Documents as discover leaves them (``{folder}/{first four hex}.pdf``, ten bytes each),
    committed; returns their ids."""
    ids = list(doc_ids)
    rows = [(d, f"{folder}/{d[:4]}.pdf", 10) for d in ids]
    db.execute_values(conn, "plan/upsert_documents", rows)
    conn.commit()
    return ids


def flaky_connect(failures: int) -> Callable[..., Any]:
    """``db.connect`` while Postgres restarts: refused ``failures`` times, then a connection."""
    calls = {"n": 0}

    def connect(dsn: str, *, autocommit: bool = False) -> Any:
        calls["n"] += 1
        if calls["n"] <= failures:
            raise psycopg2.OperationalError("connection refused: the server is restarting")
        return mock.MagicMock(closed=0, autocommit=autocommit)

    return connect
