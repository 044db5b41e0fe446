"""WebhookNotifier: post a task's failure to a webhook, e.g. the dead-letter spike alert.

An Airflow notifier (``BaseNotifier`` from the task SDK), used as a task's
``on_failure_callback`` the way Airflow's Slack or SMTP notifiers are::

    task(alert, task_id="alert", on_failure_callback=WebhookNotifier(title="..."))

Airflow runs it in the task's own process right after the task has failed, with the error in
the context; whatever becomes of the delivery, the task stays failed (red in the grid) and a
failed delivery is logged by Airflow, so an alert is never lost silently.

The Airflow connection (``replayable_alerts`` by default) says where to post:

- ``host``: the full URL (``https://hooks.example.com/services/…``), or a bare host with
  ``schema`` (http/https), ``port`` and ``extra.path``;
- ``password``: an optional bearer token, sent as ``Authorization: Bearer``;
- ``extra.timeout_s``: the deadline of one request (default 10 s).

Delivery is a JSON ``POST`` with an ``Idempotency-Key`` named after the task instance and
its try, so a receiver that de-duplicates sees one alert however often it is retried.
Connection errors, timeouts, 408, 429 and 5xx are retried with full-jitter backoff (a
``Retry-After`` wins) up to ``max_attempts`` requests and ``max_total_s`` seconds; other
answers fail at once. Neither the token nor the URL's path (webhook URLs often carry their
secret in it) is ever logged or put in an error: only the scheme and host are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow.sdk import BaseNotifier, Context

from replayable.airflow.hooks.webhook import connection_fields
from replayable.endpoints import url_from_fields
from replayable.vocabulary import ALERTS_CONN_ID

if TYPE_CHECKING:
    from replayable.retry import CallRetry

__all__ = ["WebhookDeliveryError", "WebhookNotifier", "WebhookTarget"]


class WebhookDeliveryError(Exception):
    """The webhook did not accept the notification; the message names only scheme and host."""


@dataclass(frozen=True)
class WebhookTarget:
    """Where and how to post: the URL, the optional bearer token, the request deadline."""

    url: str = field(repr=False)
    token: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0

    @property
    def where(self) -> str:
        """Scheme and host only: safe to log."""
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")

    @classmethod
    def from_fields(
        cls,
        host: str | None,
        port: int | None,
        schema: str | None,
        password: str | None,
        extra: dict[str, Any],
    ) -> WebhookTarget:
        """Build the target from a connection's fields; raises naming a missing or bad one."""
        if not host:
            raise ValueError(
                "the alerts connection has no host: set it to the webhook's URL, e.g. "
                "https://hooks.example.com/replayable"
            )
        url = url_from_fields(host, port, schema, "/" + str(extra.get("path", "")).lstrip("/"))
        timeout_s = float(extra.get("timeout_s", 10.0))
        if not timeout_s > 0:
            raise ValueError(f"the alerts connection's timeout_s must be > 0, got {timeout_s}")
        return cls(url=url, token=password or None, timeout_s=timeout_s)


def deliver(target: WebhookTarget, body: dict[str, Any], *, key: str, retry: CallRetry) -> int:
    """POST ``body`` to ``target`` with bounded retries; return the requests it took.

    Raises :class:`WebhookDeliveryError` (without the URL's path or the token) when the
    webhook refuses it or stays unreachable.
    """
    # Imported here: DAG files import this module, and parsing them must stay cheap.
    import httpx

    from replayable.retry import call_with_retries, classify

    headers = {"Idempotency-Key": key, "User-Agent": "replayable-webhook-notifier"}
    if target.token:
        headers["Authorization"] = f"Bearer {target.token}"
    attempts = 0
    with httpx.Client(timeout=httpx.Timeout(target.timeout_s)) as http:

        def once() -> None:
            nonlocal attempts
            attempts += 1
            http.post(target.url, json=body, headers=headers).raise_for_status()

        try:
            call_with_retries(once, retry, describe=f"webhook to {target.where}")
        except Exception as error:
            failure = classify(error)
            # Not chained: httpx's messages name the full URL.
            raise WebhookDeliveryError(
                f"webhook to {target.where} failed after {attempts} request(s): "
                f"{failure.error_class}"
            ) from None
    return attempts


class WebhookNotifier(BaseNotifier):
    """Post a failed task's error and links to the webhook of an Airflow connection.

    :param conn_id: Airflow connection of the webhook (see the module docstring); templated.
    :param title: the alert's headline, e.g. "Dead-letter spike"; templated.
    :param max_attempts: requests at most, the first included (>= 1).
    :param max_total_s: give up when the next wait would end later than this (> 0).
    """

    template_fields: Sequence[str] = ("conn_id", "title")

    def __init__(
        self,
        *,
        conn_id: str = ALERTS_CONN_ID,
        title: str = "Airflow task failed",
        max_attempts: int = 4,
        max_total_s: float = 60.0,
    ) -> None:
        super().__init__()
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if not max_total_s > 0:
            raise ValueError(f"max_total_s must be > 0, got {max_total_s}")
        self.conn_id = conn_id
        self.title = title
        self.max_attempts = max_attempts
        self.max_total_s = max_total_s

    def payload(self, context: Context) -> dict[str, Any]:
        """The JSON body: the title, the error message, and where to look in Airflow."""
        ti = context.get("ti")
        error = context.get("exception")
        body: dict[str, Any] = {
            "title": self.title,
            "message": str(error) if error is not None else self.title,
            "dag_id": getattr(ti, "dag_id", None),
            "run_id": getattr(ti, "run_id", None),
            "task_id": getattr(ti, "task_id", None),
            "map_index": getattr(ti, "map_index", None),
            "try_number": getattr(ti, "try_number", None),
            "sent_at": datetime.now(UTC).isoformat(),
        }
        try:
            body["log_url"] = ti.log_url if ti is not None else None
        except Exception:  # a log link is a courtesy; the alert goes out without it
            body["log_url"] = None
        return body

    def idempotency_key(self, body: dict[str, Any]) -> str:
        """One key per task instance try: retries of the delivery repeat it."""
        parts = [str(body.get(k)) for k in ("dag_id", "run_id", "task_id", "map_index")]
        parts.append(str(body.get("try_number")))
        return "replayable-alert-" + hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:40]

    def notify(self, context: Context) -> None:
        target = WebhookTarget.from_fields(*connection_fields(self.conn_id))
        from replayable.retry import CallRetry

        body = self.payload(context)
        retry = CallRetry(
            max_attempts=self.max_attempts, max_total_s=self.max_total_s, base_s=0.5, cap_s=10.0
        )
        attempts = deliver(target, body, key=self.idempotency_key(body), retry=retry)
        self.log.info(
            "%s: alert delivered to %s in %d request(s)", self.title, target.where, attempts
        )
