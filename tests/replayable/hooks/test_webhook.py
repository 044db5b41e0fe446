"""HTTP connections: the URL their fields name, and a webhook connection's fields."""

from __future__ import annotations

import json

import pytest

from replayable.hooks.webhook import ConnectionFields, connection_fields, url_from_fields


@pytest.mark.parametrize(
    ("host", "port", "schema", "path", "url"),
    [
        ("https://h.example/x/", 9, "http", "/ignored", "https://h.example/x/"),
        ("h.example", None, None, "/hook", "https://h.example/hook"),
        ("h.example", 8080, "http", "/v1", "http://h.example:8080/v1"),
        ("h.example", 443, "ftp", "", "https://h.example:443"),
    ],
)
def test_a_connections_fields_name_one_url(host, port, schema, path, url):
    """A URL host wins; else https unless the schema says http, the port, then the path."""
    assert url_from_fields(host, port, schema, path) == url


def test_a_webhook_connections_fields_are_read_through_the_hook(monkeypatch):
    """The sink and the notifier get host, port, schema, password and extra from here."""
    conn = {"conn_type": "http", "host": "h.example", "port": 8443, "schema": "https"}
    conn |= {"password": "tok", "extra": {"path": "/in"}}
    monkeypatch.setenv("AIRFLOW_CONN_HOOK_FIELDS", json.dumps(conn))
    fields = connection_fields("hook_fields")
    assert fields == ConnectionFields("h.example", 8443, "https", "tok", {"path": "/in"})
    assert url_from_fields(*fields[:3], fields.extra["path"]) == "https://h.example:8443/in"
