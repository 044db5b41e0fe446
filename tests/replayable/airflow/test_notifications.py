"""WebhookNotifier against real HTTP receivers on loopback: the local model server's webhook
receiver (retries, de-duplication) and a tiny receiver of the test's own (headers, refusals).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from devtools.model_server import LocalModelServer
from replayable.airflow.notifications import WebhookDeliveryError, WebhookNotifier, WebhookTarget

TOKEN = "alert-token-never-logged"  # noqa: S105 - a test value


def failed_alert_context(try_number: int = 1) -> dict[str, Any]:
    """What Airflow hands an on_failure_callback of the watch's alert task, in the parts used."""
    ti = SimpleNamespace(
        dag_id="dead_letter_watch",
        run_id="manual__1",
        task_id="alert",
        map_index=-1,
        try_number=try_number,
        log_url="http://airflow.example/dags/dead_letter_watch/runs/manual__1/tasks/alert",
    )
    error = RuntimeError("Dead-letter spike: 12 new dead letters in the last 60 min")
    return {"ti": ti, "exception": error}


def use_alerts_connection(monkeypatch: pytest.MonkeyPatch, **fields: Any) -> None:
    fields.setdefault("conn_type", "http")
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_ALERTS", json.dumps(fields))


def test_a_failure_reaches_the_webhook_once_through_503s(model: LocalModelServer, monkeypatch):
    model.set_faults(webhook_statuses=[503, 503, 200])
    use_alerts_connection(monkeypatch, host=model.webhook_url("alerts"))
    notifier = WebhookNotifier(title="Dead-letter spike", max_attempts=4)
    notifier(failed_alert_context())  # as Airflow calls a callback
    events = model.webhook_events("alerts")
    assert len(events) == 1
    body = events[0]["body"]
    assert body["title"] == "Dead-letter spike"
    assert body["message"].startswith("Dead-letter spike: 12 new dead letters")
    assert (body["dag_id"], body["task_id"], body["try_number"]) == (
        "dead_letter_watch",
        "alert",
        1,
    )
    assert body["log_url"].endswith("/tasks/alert")
    assert model.stats()["webhooks"]["received"] == 3


def test_a_second_delivery_of_the_same_try_is_deduplicated(model, monkeypatch):
    use_alerts_connection(monkeypatch, host=model.webhook_url("alerts"))
    notifier = WebhookNotifier(title="Dead-letter spike")
    notifier(failed_alert_context())
    notifier(failed_alert_context())  # e.g. a callback run again: same key, one alert
    notifier(failed_alert_context(try_number=2))  # a new try is a new alert
    assert len(model.webhook_events("alerts")) == 2


def test_retry_after_is_honoured(model, monkeypatch):
    model.set_faults(webhook_statuses=[429, 200], retry_after="1")
    use_alerts_connection(monkeypatch, host=model.webhook_url("alerts"))
    import time

    started = time.monotonic()
    WebhookNotifier(title="t").notify(failed_alert_context())
    assert time.monotonic() - started >= 1.0
    assert len(model.webhook_events("alerts")) == 1


class _Receiver(BaseHTTPRequestHandler):
    status = 200
    requests: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
        self.send_response(self.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, type[_Receiver]]]:
    handler = type("Handler", (_Receiver,), {"requests": [], "status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_the_token_goes_in_the_header_and_never_into_the_logs(
    receiver, monkeypatch, caplog: pytest.LogCaptureFixture
):
    url, handler = receiver
    use_alerts_connection(monkeypatch, host=f"{url}/hooks/s3cr3t-path", password=TOKEN)
    with caplog.at_level(logging.DEBUG):
        WebhookNotifier(title="Dead-letter spike").notify(failed_alert_context())
    (request,) = handler.requests
    assert request["path"] == "/hooks/s3cr3t-path"
    assert request["headers"]["Authorization"] == f"Bearer {TOKEN}"
    assert request["headers"]["Idempotency-Key"].startswith("replayable-alert-")
    assert request["headers"]["Content-Type"] == "application/json"
    assert TOKEN not in caplog.text
    assert "s3cr3t-path" not in caplog.text


def test_a_refusal_fails_at_once_naming_only_scheme_and_host(receiver, monkeypatch, caplog):
    url, handler = receiver
    handler.status = 400
    use_alerts_connection(monkeypatch, host=f"{url}/hooks/s3cr3t-path", password=TOKEN)
    with caplog.at_level(logging.DEBUG), pytest.raises(WebhookDeliveryError) as raised:
        WebhookNotifier(title="t").notify(failed_alert_context())
    assert len(handler.requests) == 1
    assert str(raised.value) == f"webhook to {url} failed after 1 request(s): http_400"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert "s3cr3t-path" not in caplog.text and TOKEN not in caplog.text


def test_an_unreachable_webhook_is_given_up_after_max_attempts(receiver, monkeypatch):
    url, handler = receiver
    handler.status = 503
    use_alerts_connection(monkeypatch, host=url)
    with pytest.raises(WebhookDeliveryError, match="after 2 request"):
        WebhookNotifier(title="t", max_attempts=2).notify(failed_alert_context())
    assert len(handler.requests) == 2


def test_a_bare_host_connection_builds_the_url() -> None:
    target = WebhookTarget.from_fields("hooks.example", 8443, "https", None, {"path": "/a/b"})
    assert (target.url, target.where) == (
        "https://hooks.example:8443/a/b",
        "https://hooks.example:8443",
    )
    with pytest.raises(ValueError, match="no host"):
        WebhookTarget.from_fields(None, None, None, "secret", {})


def test_bad_bounds_are_rejected_naming_them() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        WebhookNotifier(max_attempts=0)
    with pytest.raises(ValueError, match="max_total_s"):
        WebhookNotifier(max_total_s=0)
