"""One way from an HTTP connection's fields to a URL, for the sink, the notifier and the model."""

from __future__ import annotations

import pytest

from replayable.endpoints import url_from_fields
from replayable.models.endpoint import settings_from_fields


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


@pytest.mark.parametrize(
    ("host", "port", "schema", "extra", "base_url"),
    [
        ("http://127.0.0.1:8765/v1/", None, None, {}, "http://127.0.0.1:8765/v1"),
        ("api.example", None, None, {}, "https://api.example/v1"),
        ("127.0.0.1", 11434, "http", {"base_path": "/v1/"}, "http://127.0.0.1:11434/v1"),
    ],
)
def test_the_model_endpoint_is_named_the_same_way_without_a_trailing_slash(
    host, port, schema, extra, base_url
):
    assert settings_from_fields(host, port, schema, None, extra).base_url == base_url


def test_max_tpm_is_read_from_the_extra_and_a_bad_one_is_refused_naming_it():
    def tpm(value):
        return settings_from_fields("http://127.0.0.1:1/v1", None, None, None, {"max_tpm": value})

    assert tpm(150_000).max_tpm == 150_000
    assert tpm("90000").max_tpm == 90_000
    assert tpm(None).max_tpm is None
    for bad in (0, -5, "lots", float("inf"), [1]):
        with pytest.raises(ValueError, match="max_tpm"):
            tpm(bad)
