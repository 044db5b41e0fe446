"""The fields of a webhook's HTTP connection, read from Airflow.

The URL they name is built by :func:`replayable.endpoints.url_from_fields`, the one way the
events sink, the alerts notifier and the model endpoint build theirs.
"""

from __future__ import annotations

from airflow.sdk import BaseHook

from replayable.endpoints import ConnectionFields

__all__ = ["ConnectionFields", "connection_fields"]


def connection_fields(conn_id: str) -> ConnectionFields:
    """Read the Airflow connection ``conn_id`` (only in tasks: it needs Airflow's context)."""
    conn = BaseHook.get_connection(conn_id)
    return ConnectionFields(conn.host, conn.port, conn.schema, conn.password, conn.extra_dejson)
