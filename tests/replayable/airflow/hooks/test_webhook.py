"""A webhook connection's fields, read through the hook."""

from __future__ import annotations

import json

from replayable.airflow.hooks.webhook import ConnectionFields, connection_fields
from replayable.endpoints import url_from_fields


def test_a_webhook_connections_fields_are_read_through_the_hook(monkeypatch):
    """The sink and the notifier get host, port, schema, password and extra from here."""
    conn = {"conn_type": "http", "host": "h.example", "port": 8443, "schema": "https"}
    conn |= {"password": "tok", "extra": {"path": "/in"}}
    monkeypatch.setenv("AIRFLOW_CONN_HOOK_FIELDS", json.dumps(conn))
    fields = connection_fields("hook_fields")
    assert fields == ConnectionFields("h.example", 8443, "https", "tok", {"path": "/in"})
    assert url_from_fields(*fields[:3], fields.extra["path"]) == "https://h.example:8443/in"
