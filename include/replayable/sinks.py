"""Where outbox events are delivered: a webhook over httpx, configured by a connection.

The connection (default id ``replayable_events``) holds the endpoint and the secret:

- ``host``: the full URL (``https://hooks.example.com/replayable``), or a bare host with
  ``port``, ``schema`` (``http``/``https``) and ``extra.path``;
- ``password``: sent as a bearer token, if any (never logged);
- ``extra``: ``timeout_s`` (one request's whole deadline, default 10), ``max_attempts``
  and ``max_total_s`` (retries within one delivery, default 4 and 30 s).

Each event is POSTed as JSON with ``Idempotency-Key: <event id>``; a 2xx is the receiver's
acknowledgement. Failures are classified and retried as model calls are
(:func:`replayable.retry.call_with_retries`: 408/429/5xx and connection errors with full
jitter, Retry-After winning; other 4xx terminal; 401/403 systemic).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from replayable.outbox import Event
from replayable.retry import CallRetry, call_with_retries

# A receiver's acknowledgement is small; a larger answer is read no further.
MAX_RESPONSE_BYTES = 1024 * 1024
# Retries within one delivery: the model calls' policy, with a shorter total.
DEFAULT_RETRY = CallRetry(max_attempts=4, max_total_s=30.0, base_s=0.5, cap_s=10.0)


@dataclass(frozen=True)
class WebhookSettings:
    """Endpoint, credentials and bounds of the webhook sink."""

    url: str
    token: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    retry: CallRetry = DEFAULT_RETRY


def webhook_settings(
    host: str | None,
    port: int | None,
    schema: str | None,
    password: str | None,
    extra: dict[str, Any],
) -> WebhookSettings:
    """Build WebhookSettings from a connection's fields; raises naming a missing field."""
    if not host:
        raise ValueError(
            "the events connection has no host: set it to the webhook URL, e.g. "
            "https://hooks.example.com/replayable"
        )
    if host.startswith(("http://", "https://")):
        url = host
    else:
        scheme = schema if schema in ("http", "https") else "https"
        netloc = f"{host}:{port}" if port else host
        url = f"{scheme}://{netloc}/{str(extra.get('path', '')).lstrip('/')}"
    defaults = WebhookSettings(url)
    retry = CallRetry(
        max_attempts=int(extra.get("max_attempts", defaults.retry.max_attempts)),
        max_total_s=float(extra.get("max_total_s", defaults.retry.max_total_s)),
        base_s=defaults.retry.base_s,
        cap_s=defaults.retry.cap_s,
    )
    timeout_s = float(extra.get("timeout_s", defaults.timeout_s))
    if timeout_s <= 0 or retry.max_attempts < 1 or retry.max_total_s < 0:
        raise ValueError(
            "the events connection's extra needs timeout_s > 0, max_attempts >= 1 and "
            f"max_total_s >= 0; got {extra!r}"
        )
    return WebhookSettings(url, password or None, timeout_s, retry)


def webhook_settings_from_connection(conn_id: str) -> WebhookSettings:
    """Read the Airflow connection ``conn_id`` (an Airflow import, so only called in tasks)."""
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    return webhook_settings(conn.host, conn.port, conn.schema, conn.password, conn.extra_dejson)


class WebhookSink:
    """Deliver events as JSON POSTs, keyed by ``Idempotency-Key``, with classified retries.

    :param settings: endpoint, token, deadline and retry bounds.
    """

    def __init__(self, settings: WebhookSettings) -> None:
        self.settings = settings
        headers = {"Content-Type": "application/json"}
        if settings.token:
            headers["Authorization"] = f"Bearer {settings.token}"
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(settings.timeout_s))

    @property
    def max_send_s(self) -> float:
        # A try takes at most timeout_s. call_with_retries starts no wait that would end past
        # max_total_s when it knows the wait (Retry-After), but a jitter draw (at most
        # cap_s) and the try after it can run past that.
        retry, timeout_s = self.settings.retry, self.settings.timeout_s
        if retry.max_attempts == 1:
            return timeout_s
        return retry.max_total_s + retry.cap_s + timeout_s

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> WebhookSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def deliver(self, event: Event) -> None:
        body = json.dumps(event.envelope(), sort_keys=True, separators=(",", ":")).encode()
        call_with_retries(
            lambda: self._post(event.event_id, body),
            self.settings.retry,
            describe=f"webhook {event.event_id}",
        )

    def _post(self, key: str, body: bytes) -> None:
        deadline = time.monotonic() + self.settings.timeout_s
        with self._http.stream(
            "POST", self.settings.url, content=body, headers={"Idempotency-Key": key}
        ) as response:
            # Read by a total deadline and a size cap, as the embeddings client does: a
            # receiver that trickles its answer must not hold the lease past its end.
            size = 0
            for part in response.iter_bytes():
                size += len(part)
                if size > MAX_RESPONSE_BYTES:
                    break
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout("the webhook's answer did not finish in time")
        response.raise_for_status()
