"""The webhook sink's settings, taken from a connection's fields."""

import pytest

from replayable.retry import CallRetry
from replayable.sinks import WebhookSettings, WebhookSink, webhook_settings

SECRET = "not-a-real-token"  # noqa: S105 - a stand-in value for the test


def test_a_full_url_in_host_is_the_endpoint():
    settings = webhook_settings("https://hooks.example.com/in", None, None, SECRET, {})
    assert settings.url == "https://hooks.example.com/in"
    assert settings.token == SECRET
    assert SECRET not in repr(settings)


def test_a_bare_host_is_joined_with_port_schema_and_path():
    settings = webhook_settings("hooks", 8443, "http", None, {"path": "/events", "timeout_s": 3})
    assert settings.url == "http://hooks:8443/events"
    assert settings.timeout_s == 3.0


def test_a_connection_without_host_is_refused_naming_it():
    with pytest.raises(ValueError, match="no host"):
        webhook_settings(None, None, None, None, {})


def test_bad_bounds_in_extra_are_refused_naming_them():
    with pytest.raises(ValueError, match="timeout_s"):
        webhook_settings("https://h/x", None, None, None, {"timeout_s": 0})


def test_a_delivery_is_bounded_by_its_tries_and_waits():
    once = WebhookSink(WebhookSettings("https://h/x", timeout_s=2, retry=CallRetry(max_attempts=1)))
    retried = WebhookSink(
        WebhookSettings("https://h/x", timeout_s=2, retry=CallRetry(max_total_s=30, cap_s=10))
    )
    try:
        assert once.max_send_s == 2
        assert retried.max_send_s == 42
    finally:
        once.close()
        retried.close()
