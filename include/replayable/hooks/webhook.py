"""HTTP connections: the URL their fields name, and the fields of a webhook's connection.

The events sink (:mod:`replayable.sinks`), the alerts notifier
(:mod:`replayable.notifications`) and the model endpoint build their URLs the same way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from airflow.sdk import BaseHook

__all__ = ["ConnectionFields", "connection_fields", "url_from_fields"]


class ConnectionFields(NamedTuple):
    """The fields of an HTTP connection that name and authorize its endpoint."""

    host: str | None
    port: int | None
    schema: str | None
    password: str | None
    extra: dict[str, Any]


def connection_fields(conn_id: str) -> ConnectionFields:
    """Read the Airflow connection ``conn_id`` (only in tasks: it needs Airflow's context)."""
    conn = BaseHook.get_connection(conn_id)
    return ConnectionFields(conn.host, conn.port, conn.schema, conn.password, conn.extra_dejson)


def url_from_fields(host: str, port: int | None, schema: str | None, path: str) -> str:
    """The URL an HTTP connection's fields name; ``host`` must be set (callers say why not).

    A ``host`` that is a URL (``http://`` or ``https://``) is the URL itself and the other
    fields are ignored; else ``schema`` gives the scheme (``https`` unless it says ``http``),
    ``port`` joins the host, and ``path`` follows as given.
    """
    if host.startswith(("http://", "https://")):
        return host
    scheme = schema if schema in ("http", "https") else "https"
    netloc = f"{host}:{port}" if port else host
    return f"{scheme}://{netloc}{path}"
