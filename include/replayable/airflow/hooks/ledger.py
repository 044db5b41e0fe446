"""The ledger connection: the replayable database's Airflow connection as a libpq DSN."""

from __future__ import annotations

from airflow.sdk import BaseHook

__all__ = ["connection_dsn"]


def connection_dsn(conn_id: str) -> str:
    """Turn the Airflow Postgres connection ``conn_id`` into a libpq DSN."""
    import psycopg2.extensions

    conn = BaseHook.get_connection(conn_id)
    options = {
        "host": conn.host,
        "port": conn.port,
        "user": conn.login,
        "password": conn.password,
        "dbname": conn.schema,
    }
    return str(psycopg2.extensions.make_dsn(**{k: v for k, v in options.items() if v}))
