"""The UI's connection pool: at most its size, a statement timeout, and no waiting (ADR 0073)."""

from __future__ import annotations

import threading

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import pytest

from replayable import db
from replayable.web.pool import ConnectionPool, PoolBusyError


def test_the_pool_never_opens_more_connections_than_its_size(dsn: str) -> None:
    pool = ConnectionPool(lambda: dsn, size=2, statement_timeout_s=5)
    seen: set[int] = set()
    refused: list[int] = []
    lock = threading.Lock()

    def use() -> None:
        try:
            with pool.connection(readonly=True) as conn:
                rows = db.fetch_all(conn, "views/dead_letter_status", {"id": 0})
                assert rows == []
                with conn.cursor() as cur:
                    cur.execute("SELECT pg_backend_pid(), pg_sleep(0.05)")
                    pid = cur.fetchone()[0]
                with lock:
                    seen.add(pid)
        except PoolBusyError:
            with lock:
                refused.append(1)

    try:
        threads = [threading.Thread(target=use) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert 1 <= len(seen) <= 2
        assert pool.in_use == 0
    finally:
        pool.close()


def test_the_pool_sets_the_statement_timeout_and_read_only_transactions(dsn: str) -> None:
    pool = ConnectionPool(lambda: dsn, size=1, statement_timeout_s=0.2)
    try:
        with pool.connection(readonly=True) as conn, conn.cursor() as cur:
            cur.execute("SHOW statement_timeout")
            assert cur.fetchone() == ("200ms",)
            cur.execute("SHOW transaction_read_only")
            assert cur.fetchone() == ("on",)
            with pytest.raises(psycopg2.errors.QueryCanceled):
                cur.execute("SELECT pg_sleep(2)")
        with pool.connection(readonly=False) as conn, conn.cursor() as cur:
            cur.execute("SHOW transaction_read_only")
            assert cur.fetchone() == ("off",)
    finally:
        pool.close()


def test_the_pool_refuses_at_once_when_every_connection_is_taken(dsn: str) -> None:
    pool = ConnectionPool(lambda: dsn, size=1)
    outcome: list[str] = []

    def take() -> None:
        try:
            with pool.connection(readonly=True):
                outcome.append("connection")
        except PoolBusyError:
            outcome.append("busy")

    contender = threading.Thread(target=take)
    try:
        with pool.connection(readonly=True):
            contender.start()
            contender.join(timeout=5)  # a waiting contender would take the freed connection
        contender.join(timeout=60)
        assert outcome == ["busy"]
        assert pool.in_use == 0
    finally:
        pool.close()
