"""What every task callable of the pipeline shares: its Airflow context and the database."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from airflow.sdk import get_current_context

from replayable import db
from replayable.airflow.hooks import connection_dsn

__all__ = ["get_current_context", "on_database"]

T = TypeVar("T")


def on_database(conn_id: str, fn: Callable[[db.Connection], T], describe: str) -> T:
    """Run ``fn`` on the replayable database and commit, waiting out a restart (ADR 13).

    A task that starts while Postgres restarts waits for it instead of failing a try; ``fn``
    may run again after a lost connection, which each of these steps allows, as a task
    retry would.
    """
    database = db.Database(connection_dsn(conn_id))
    try:
        return database.transaction(fn, describe=describe)
    finally:
        database.close()
