"""The webhook sink's settings, taken from a connection's fields."""

import pytest

from replayable.airflow.sinks import WebhookSettings, WebhookSink, redact_url, webhook_settings
from replayable.retry import CallRetry

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


SECRET_PATH = "hooks/s3cr3t-path"  # noqa: S105 - a stand-in path for the test


def test_the_settings_show_the_webhook_by_scheme_and_host_only():
    settings = webhook_settings(
        f"https://hooks.example.com:8443/{SECRET_PATH}", None, None, None, {}
    )
    assert SECRET_PATH not in repr(settings)
    assert settings.where == "https://hooks.example.com:8443"


def test_bad_bounds_are_refused_without_quoting_the_secret_path():
    with pytest.raises(ValueError, match="timeout_s") as refused:
        webhook_settings("hooks", None, "https", None, {"path": SECRET_PATH, "timeout_s": -1})
    assert SECRET_PATH not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:pw@hooks.example.com/a/b?token=x", "https://hooks.example.com"),
        ("http://127.0.0.1:9000/webhooks/x", "http://127.0.0.1:9000"),
        ("http://[::1]:9000/x", "http://[::1]:9000"),
    ],
)
def test_a_url_is_redacted_to_scheme_and_host(url, shown):
    assert redact_url(url) == shown
