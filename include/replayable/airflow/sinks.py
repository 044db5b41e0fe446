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

The URL's path (and query, and any user part) is often the secret that lets a caller post
to the hook, so nothing here shows more of it than scheme and host (:func:`redact_url`):
not the settings' repr, not a refused connection's message, and not the errors a delivery
raises, which the outbox stores as ``last_error`` and logs (ADR 0070).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from replayable.airflow.hooks.webhook import connection_fields
from replayable.endpoints import url_from_fields
from replayable.outbox import Event
from replayable.retry import CallRetry, call_with_retries

# A receiver's acknowledgement is small; a larger answer is read no further.
MAX_RESPONSE_BYTES = 1024 * 1024
# Retries within one delivery: the model calls' policy, with a shorter total.
DEFAULT_RETRY = CallRetry(max_attempts=4, max_total_s=30.0, base_s=0.5, cap_s=10.0)


def redact_url(url: str) -> str:
    """``url`` as its scheme and host (and port): the rest may be a secret."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:  # not a URL one could parse: show none of it
        return "(unparsable URL)"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


@dataclass(frozen=True)
class WebhookSettings:
    """Endpoint, credentials and bounds of the webhook sink."""

    url: str = field(repr=False)  # its path may be the hook's secret; see ``where``
    token: str | None = field(default=None, repr=False)
    timeout_s: float = 10.0
    retry: CallRetry = DEFAULT_RETRY

    @property
    def where(self) -> str:
        """The endpoint as it may be shown: scheme and host."""
        return redact_url(self.url)


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
    url = url_from_fields(host, port, schema, "/" + str(extra.get("path", "")).lstrip("/"))
    defaults = WebhookSettings(url)
    retry = CallRetry(
        max_attempts=int(extra.get("max_attempts", defaults.retry.max_attempts)),
        max_total_s=float(extra.get("max_total_s", defaults.retry.max_total_s)),
        base_s=defaults.retry.base_s,
        cap_s=defaults.retry.cap_s,
    )
    timeout_s = float(extra.get("timeout_s", defaults.timeout_s))
    if timeout_s <= 0 or retry.max_attempts < 1 or retry.max_total_s < 0:
        # Only the bounds are quoted: the extra may hold the URL's secret path.
        raise ValueError(
            "the events connection's extra needs timeout_s > 0, max_attempts >= 1 and "
            f"max_total_s >= 0; got timeout_s={timeout_s:g}, "
            f"max_attempts={retry.max_attempts}, max_total_s={retry.max_total_s:g}"
        )
    return WebhookSettings(url, password or None, timeout_s, retry)


def webhook_settings_from_connection(conn_id: str) -> WebhookSettings:
    """Read the Airflow connection ``conn_id`` (through its hook, so only called in tasks)."""
    return webhook_settings(*connection_fields(conn_id))


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
        # httpx logs every request's full URL at INFO, which Airflow's task log keeps.
        self._log_filter = _RedactUrl(settings.url, settings.where)
        logging.getLogger("httpx").addFilter(self._log_filter)

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
        logging.getLogger("httpx").removeFilter(self._log_filter)

    def __enter__(self) -> WebhookSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def deliver(self, event: Event) -> None:
        body = json.dumps(event.envelope(), sort_keys=True, separators=(",", ":")).encode()
        try:
            call_with_retries(
                lambda: self._post(event.event_id, body),
                self.settings.retry,
                describe=f"webhook {event.event_id}",
            )
        except httpx.HTTPError as error:
            # Raised again without the original chained: httpx quotes the full URL.
            raise self._redacted(error) from None

    def _redacted(self, error: httpx.HTTPError) -> httpx.HTTPError:
        """The same error (type, request, response) with the URL shown as scheme and host."""
        where = self.settings.where
        if isinstance(error, httpx.HTTPStatusError):
            response = error.response
            return httpx.HTTPStatusError(
                f"{response.status_code} {response.reason_phrase} from the webhook at {where}",
                request=error.request,
                response=response,
            )
        message = str(error)
        for shown in sorted({self.settings.url, _as_sent(self.settings.url)}, key=len)[::-1]:
            message = message.replace(shown, where)
        path = urlsplit(self.settings.url).path
        if len(path) > 1:
            message = message.replace(path, "/…")
        if isinstance(error, httpx.RequestError):
            try:
                request: httpx.Request | None = error.request
            except RuntimeError:  # raised without a request
                request = None
            return type(error)(message, request=request)
        return httpx.HTTPError(message)

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


def _as_sent(url: str) -> str:
    """``url`` as httpx writes it in its messages (normalised)."""
    try:
        return str(httpx.URL(url))
    except httpx.InvalidURL:
        return url


class _RedactUrl(logging.Filter):
    """Show one URL in httpx's log records as scheme and host only."""

    def __init__(self, url: str, where: str) -> None:
        super().__init__()
        self.secrets = sorted({url, _as_sent(url)}, key=len, reverse=True)
        self.where = where

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(
            secret in str(arg) for arg in record.args for secret in self.secrets
        ):
            record.args = tuple(self._hide(arg) for arg in record.args)
        return True

    def _hide(self, arg: object) -> object:
        text = str(arg)
        if not any(secret in text for secret in self.secrets):
            return arg  # e.g. the status code, which the format wants as a number
        for secret in self.secrets:
            text = text.replace(secret, self.where)
        return text
