"""HTTP endpoints named by a connection's fields: one way from fields to a URL.

The events sink (:mod:`replayable.airflow.sinks`), the alerts notifier
(:mod:`replayable.airflow.notifications`) and the model endpoint
(:mod:`replayable.models.endpoint`) build their URLs here. Nothing here imports
Airflow: :func:`replayable.airflow.hooks.webhook.connection_fields` reads the fields from a
connection; the stages get them handed in.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["ConnectionFields", "url_from_fields"]


class ConnectionFields(NamedTuple):
    """The fields of an HTTP connection that name and authorize its endpoint."""

    host: str | None
    port: int | None
    schema: str | None
    password: str | None
    extra: dict[str, Any]


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
