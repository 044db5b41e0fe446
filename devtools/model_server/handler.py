"""The HTTP handler: the model API, the webhook receivers and the control endpoints.

The model API (``Authorization: Bearer KEY`` when the server has an API key, 401
otherwise; errors in OpenAI's shape, 400 naming the bad field of a body):

- ``POST /v1/embeddings``: OpenAI's embeddings, ``{"model", "input", "dimensions",
  "encoding_format"}``, answered with feature-hash vectors
  (:mod:`devtools.model_server.vectors`);
- ``POST /v1/chat/completions``: OpenAI's chat completions, ``{"model", "messages":
  [{"role", "content"}], "max_tokens" or "max_completion_tokens", "temperature"}``,
  answered with an extractive summary of the last user message, the same for the same
  request (:mod:`devtools.model_server.chat`);
- ``/v1/files`` and ``/v1/batches``: OpenAI's Files and Batch API, for embeddings
  batches: upload a JSONL file, create a batch, poll it, download its output and error
  files (:mod:`devtools.model_server.batches`, which describes every endpoint).

Embeddings and chat go through the same steps, so that every ``/v1`` fault, the idempotency
memory, the tokens-per-minute limit and the counters treat them alike (where they differ,
:mod:`~devtools.model_server.faults` and :mod:`~devtools.model_server.stats` say so): the
concurrency limit lets the request in; its API key and body are checked; ``max_tpm`` takes
its usage tokens; latency, injected failures and hangs follow; it is charged, or replayed
from its ``Idempotency-Key``; its answer is sent, lost, padded or trickled.

Control endpoints (no API key needed):

- ``GET /healthz``: liveness;
- ``GET /stats``: counters since the last reset, as a JSON object (their meaning is in
  :mod:`devtools.model_server.stats`);
- ``GET /stats/arrivals``: ``{"arrivals": [...]}``, when each of the newest requests
  arrived (monotonic seconds; see :mod:`devtools.model_server.stats`);
- ``POST /stats/reset``: zero the counters, forget remembered idempotency keys and drop
  every stored webhook event, file and batch; requests that began before it are not
  counted when they finish;
- ``GET /faults``, ``PUT``/``POST /faults`` (replace), ``DELETE /faults`` (clear, which also
  releases requests held by latency, hangs or trickling): the fault configuration;
- ``POST /webhooks/NAME``: a webhook receiver; NAME is 1-100 of ``A-Z a-z 0-9 . _ -``. The
  body must be JSON and an ``Idempotency-Key`` header is required (400 without one). The
  first delivery with a key is stored and answered 200 (or the 2xx the fault config says)
  with ``{"ok": true, "name", "key", "event"}``, ``event`` being its position in NAME's
  list; a later delivery with the same key gets that same status and body and is not
  stored again, whatever its body. Failed deliveries are not remembered. Events are kept
  in memory until the next reset, every one, so a test can count them;
- ``GET /webhooks/NAME``: ``{"name", "events": [{"key", "body", "received_at"}]}``, stored
  events in arrival order, ``received_at`` an ISO 8601 UTC timestamp.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import re
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from devtools.model_server.batches import (
    UPLOAD_MAX_BODY_BYTES,
    ApiCall,
    is_files_or_batches_path,
)
from devtools.model_server.chat import chat_response, parse_chat_request
from devtools.model_server.errors import HttpError, error_body
from devtools.model_server.faults import FaultConfig, seconds_header
from devtools.model_server.idempotency import fingerprint
from devtools.model_server.stats import CHAT, EMBEDDINGS, charge_key
from devtools.model_server.vectors import (
    embeddings_response,
    parse_embeddings_request,
    usage_tokens,
)

if TYPE_CHECKING:
    from devtools.model_server.ratelimit import TokenBucket
    from devtools.model_server.server import EmbeddingServer, FaultDraw
    from devtools.model_server.stats import Ticket

MAX_BODY_BYTES = 16 * 1024 * 1024

# What serves one admitted model API request: the body to answer with, and if it is lost.
_Work = Callable[["Ticket", "FaultDraw", "str | None"], tuple[bytes, bool]]

_WEBHOOK_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")


def webhook_path(name: str) -> str:
    """Return the path of webhook receiver ``name``; raise ``ValueError`` if it is invalid."""
    if not _WEBHOOK_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid webhook name {name!r}: use 1 to 100 of A-Z, a-z, 0-9, '.', '_', '-'"
        )
    return f"/webhooks/{name}"


class OverTokenLimit(HttpError):
    """A 429 from the ``max_tpm`` limit, which the stats count as ``rejected_tpm``."""


def padded(body: bytes, size: int) -> bytes:
    """Return the JSON object ``body`` with a ``padding`` field of ``size`` characters added."""
    if size <= 0:
        return body
    return b"".join((body[:-1], b',"padding":"', b"x" * size, b'"}'))


class Handler(BaseHTTPRequestHandler):
    """One connection's requests, routed by path; every error is answered as JSON."""

    protocol_version = "HTTP/1.1"
    server_version = "ReplayableLocalModel/1"
    # Idle keep-alive connections each hold a thread; let them go eventually.
    timeout = 60
    # Headers and body go out in separate writes; with Nagle on, delayed ACKs would add
    # about 40 ms to every keep-alive response.
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        return self.server_version

    @property
    def _srv(self) -> EmbeddingServer:
        return cast("EmbeddingServer", self.server)

    def log_message(self, format: str, *args: Any) -> None:
        if self._srv.verbose:
            super().log_message(format, *args)

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        path = url.path
        try:
            if path == "/v1/embeddings" and self.command == "POST":
                self._serve_model(EMBEDDINGS, self._embed)
                return
            if path == "/v1/chat/completions" and self.command == "POST":
                self._serve_model(CHAT, self._chat)
                return
            if is_files_or_batches_path(path):
                self._serve_files_and_batches(path, url.query)
                return
            body = self._read_body()
            if path.startswith("/webhooks/"):
                self._webhook(path.removeprefix("/webhooks/"), body)
                return
            if path == "/v1" or path.startswith("/v1/"):
                self._wait_latency(self._srv.snapshot_faults())
                self._check_auth()
                raise HttpError(404, f"unknown endpoint {self.command} {path}")
            methods = _ROUTES.get(path)
            if methods is None:
                raise HttpError(404, f"unknown endpoint {path}")
            route = methods.get(self.command)
            if route is None:
                allow = ", ".join(sorted(methods))
                raise HttpError(405, f"use {allow} on {path}", headers={"Allow": allow})
            status, payload = route(self, body)
            self._send_json(status, payload)
        except HttpError as exc:
            self._send_error(exc)

    def _serve_model(self, endpoint: str, work: _Work) -> None:
        """Serve a model API request with ``work``, counting it under ``endpoint``.

        Admission, the answer's delivery (lost, padded, trickled) and the counting of
        errors are the same for every endpoint; ``work`` does the rest.
        """
        srv = self._srv
        key = self.headers.get("Idempotency-Key") or None
        faults = srv.snapshot_faults()
        config = faults.config
        ticket = srv.stats.begin(key, config.max_concurrency, endpoint)
        try:
            if not ticket.admitted:
                self._refuse_over_limit(config)
                return
            try:
                body, lost = work(ticket, faults, key)
            except HttpError as exc:
                srv.stats.fail(ticket, exc.status, over_tpm=isinstance(exc, OverTokenLimit))
                srv.stats.end(ticket)
                self._send_error(exc)
            except Exception:
                traceback.print_exc(file=sys.stderr)
                srv.stats.fail(ticket, 500)
                srv.stats.end(ticket)
                self._send_error(HttpError(500, "internal error in the local model server"))
            else:
                if lost:
                    srv.stats.end(ticket)
                    self._drop_connection()
                else:
                    body = padded(body, config.pad_response_bytes)
                    if not config.trickle_bytes_per_s:
                        srv.stats.end(ticket)
                    self._send_body(
                        200, body, trickle=config.trickle_bytes_per_s, release=faults.release
                    )
        finally:
            srv.stats.end(ticket)

    def _serve_files_and_batches(self, path: str, query: str) -> None:
        """Serve a Files or Batch API request, which needs the API key as ``/v1`` does.

        An upload may be as large as a batch input file; an upload whose response is to be
        lost (``lose_upload_responses``) is stored, then the connection is shut down.
        """
        srv = self._srv
        upload = path == "/v1/files" and self.command == "POST"
        body = self._read_body(UPLOAD_MAX_BODY_BYTES if upload else MAX_BODY_BYTES)
        self._check_auth()
        call = ApiCall(
            method=self.command,
            path=path,
            query=query,
            content_type=self.headers.get("Content-Type", ""),
            body=body,
            config=srv.snapshot_faults().config,
            dim=srv.dim,
            lose_upload=srv.lose_next_upload,
            lose_line=srv.lose_batch_line,
        )
        try:
            reply = srv.batches.serve(call)
        except HttpError:
            raise
        except Exception:
            traceback.print_exc(file=sys.stderr)
            raise HttpError(500, "internal error in the local model server") from None
        if reply.lose:
            self._drop_connection()
            return
        self._send_body(reply.status, reply.body, content_type=reply.content_type)

    def _embed(self, ticket: Ticket, faults: FaultDraw, key: str | None) -> tuple[bytes, bool]:
        """Serve one embeddings request; return the body to answer with and if it is lost."""
        body = self._read_body()
        self._check_auth()
        request = parse_embeddings_request(body, self._srv.dim)

        def render() -> tuple[dict[str, Any], list[str]]:
            digests = [hashlib.sha256(text.encode()).hexdigest() for text in request.inputs]
            return embeddings_response(request), digests

        return self._answer(
            ticket,
            faults,
            key,
            inputs=request.inputs,
            tokens=usage_tokens(request.inputs),
            request_fingerprint=fingerprint(request),
            render=render,
            charge_keys=[charge_key(request.model, request.dim, t) for t in request.inputs],
        )

    def _chat(self, ticket: Ticket, faults: FaultDraw, key: str | None) -> tuple[bytes, bool]:
        """Serve one chat completions request; return the body to answer with and if it is lost.

        The answer is computed first, cheaply, because its ``usage.total_tokens`` is what
        ``max_tpm`` charges; whether it is a refusal depends on the faults it runs under.
        """
        body = self._read_body()
        self._check_auth()
        request = parse_chat_request(body)
        response = chat_response(request, faults.config.chat_refusal_containing)
        return self._answer(
            ticket,
            faults,
            key,
            inputs=request.contents,
            tokens=response["usage"]["total_tokens"],
            request_fingerprint=fingerprint(request),
            render=lambda: (response, []),
        )

    def _answer(
        self,
        ticket: Ticket,
        faults: FaultDraw,
        key: str | None,
        *,
        inputs: Sequence[str],
        tokens: int,
        request_fingerprint: str,
        render: Callable[[], tuple[dict[str, Any], Sequence[str]]],
        charge_keys: Sequence[str] = (),
    ) -> tuple[bytes, bool]:
        """Take a checked request through the token limit and the faults, then charge it.

        As at a provider, the request was authenticated and checked first, and is let in by
        the token limit at once; only then does it take time (latency, hangs) or meet the
        injected failures. ``inputs`` are what ``fail_inputs_containing`` looks in;
        ``render`` makes the response and the digests of the inputs it embedded, only once
        the request has passed every fault. Return the body to answer with (the remembered
        one for a replay) and whether the response is to be lost.
        """
        srv = self._srv
        config = faults.config
        paid_to = self._pay_tokens(faults, key, tokens)
        self._wait_latency(faults)
        if config.status_always is not None:
            raise self._injected(config, config.status_always, "every request fails")
        for needle, poison_status in config.fail_inputs_containing:
            if any(needle in text for text in inputs):
                raise self._injected(config, poison_status, f"an input contains {needle!r}")
        draw = srv.draw(config)
        if draw.hang:
            faults.release.wait(config.hang_s)
        if draw.status is not None:
            raise self._injected(config, draw.status, "random failure")
        payload, digests = render()
        response = json.dumps(payload, separators=(",", ":")).encode()
        answer = srv.stats.settle(
            ticket,
            key,
            request_fingerprint,
            digests,
            tokens,
            response,
            dedupe=config.dedupe,
            lost=draw.lose,
            charge_keys=charge_keys,
        )
        if answer is None:
            raise HttpError(
                422,
                f"Idempotency-Key {key!r} was already used for a different request; "
                "send a new key with a new request",
                code="idempotency_key_reused",
            )
        if paid_to is not None and answer.replayed:
            # A repeat that came while the first request with its key was being served
            # paid like a new one; answered from memory, it cost nothing after all.
            paid_to.give_back(tokens)
        return answer.body, draw.lose

    def _pay_tokens(self, faults: FaultDraw, key: str | None, tokens: int) -> TokenBucket | None:
        """Take a request's ``tokens`` from the ``max_tpm`` bucket; return it if they were.

        Raise :class:`OverTokenLimit` when the bucket cannot pay for them, taking nothing.
        A request whose key is remembered is answered from memory (or refused with 422)
        and costs nothing, so it neither pays nor is refused.
        """
        bucket = faults.tokens
        if bucket is None:
            return None
        if key is not None and faults.config.dedupe and self._srv.stats.remembers(key):
            return None
        wait = bucket.take(tokens)
        if wait is None:
            return bucket
        limit = f"{bucket.rate * 60:.15g}"
        if math.isinf(wait):
            # No wait makes it fit, so there is no Retry-After to send.
            raise OverTokenLimit(
                429,
                f"request too large for the tokens per minute limit: it uses {tokens} tokens, "
                f"more than the {bucket.capacity:.15g} the limit of {limit} tokens per minute "
                "allows at once; send fewer or shorter inputs",
                code="rate_limit_exceeded",
            )
        # Seconds with decimals, which the pipeline's client and OpenAI's both read, rounded
        # up to the millisecond so that a client waiting exactly this long finds its tokens.
        retry_after = seconds_header(math.ceil(wait * 1000) / 1000)
        raise OverTokenLimit(
            429,
            f"rate limit reached for tokens per minute: limit {limit}, requested {tokens}; "
            f"try again in {retry_after} s",
            code="rate_limit_exceeded",
            headers={"Retry-After": retry_after},
        )

    def _refuse_over_limit(self, config: FaultConfig) -> None:
        # The body is read even though it is refused, to keep the connection usable.
        with contextlib.suppress(HttpError):
            self._read_body()
        self._send_error(
            HttpError(
                429,
                f"too many concurrent requests: at most {config.max_concurrency} at once",
                code="concurrency_limit_exceeded",
                headers={"Retry-After": seconds_header(config.concurrency_retry_after)},
            )
        )

    def _drop_connection(self) -> None:
        # No status line, just the end of the stream: what a client sees when a provider or
        # a proxy fails after the work was done and billed.
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _webhook(self, name: str, body: bytes) -> None:
        srv = self._srv
        if not _WEBHOOK_NAME_RE.fullmatch(name):
            raise HttpError(404, f"unknown endpoint /webhooks/{name}")
        if self.command == "GET":
            events = srv.stats.webhook_events(name)
            self._send_json(200, {"name": name, "events": events})
            return
        if self.command != "POST":
            raise HttpError(
                405, f"use GET, POST on /webhooks/{name}", headers={"Allow": "GET, POST"}
            )
        try:
            key = self.headers.get("Idempotency-Key")
            if not key:
                raise HttpError(
                    400, "an Idempotency-Key header is required", code="missing_idempotency_key"
                )
            try:
                event = json.loads(body)
            except (ValueError, RecursionError) as exc:
                raise HttpError(400, f"request body is not valid JSON: {exc}") from None
            config, status = srv.next_webhook_status()
            if status is not None and status >= 400:
                raise self._injected(config, status, "webhook delivery")
            reply = srv.stats.store_webhook(name, key, event, status or 200)
        except HttpError:
            srv.stats.fail_webhook()
            raise
        self._send_json(reply.status, reply.payload)

    def _injected(self, config: FaultConfig, status: int, reason: str) -> HttpError:
        headers: dict[str, str] = {}
        retry_after = config.retry_after_header()
        if status in (429, 503) and retry_after is not None:
            headers["Retry-After"] = retry_after
        return HttpError(
            status, f"injected fault: HTTP {status} ({reason})", code="injected", headers=headers
        )

    def _wait_latency(self, faults: FaultDraw) -> None:
        if faults.config.latency_ms > 0:
            faults.release.wait(faults.config.latency_ms / 1000)

    def _check_auth(self) -> None:
        expected = self._srv.api_key
        if expected is None:
            return
        given = self.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), expected.encode()
        ):
            raise HttpError(
                401,
                "missing or incorrect API key in the Authorization: Bearer header",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def _read_body(self, limit: int = MAX_BODY_BYTES) -> bytes:
        # The body must be consumed even when the request is refused, or the next request on
        # this keep-alive connection would be parsed from its leftovers.
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise HttpError(411, "chunked request bodies are not supported; send Content-Length")
        raw_length = self.headers.get("Content-Length", "0")
        try:
            length = int(raw_length)
        except ValueError:
            self.close_connection = True
            raise HttpError(400, f"invalid Content-Length {raw_length!r}") from None
        if length < 0:
            self.close_connection = True
            raise HttpError(400, f"invalid Content-Length {raw_length!r}")
        if length > limit:
            self.close_connection = True
            raise HttpError(413, f"request body larger than {limit} bytes")
        return self.rfile.read(length) if length else b""

    def _send_error(self, exc: HttpError) -> None:
        self._send_json(exc.status, error_body(exc.status, exc.message, exc.code), exc.headers)

    def _send_json(
        self, status: int, payload: object, headers: Mapping[str, str] | None = None
    ) -> None:
        self._send_body(status, json.dumps(payload, separators=(",", ":")).encode(), headers)

    def _send_body(
        self,
        status: int,
        data: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        content_type: str = "application/json",
        trickle: float = 0.0,
        release: threading.Event | None = None,
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if trickle > 0 and release is not None:
                self._write_slowly(data, trickle, release)
            else:
                self.wfile.write(data)
        except (ConnectionError, TimeoutError):
            # The client gave up, e.g. on a hung request; nothing is left to tell it.
            self.close_connection = True

    def _write_slowly(self, data: bytes, rate: float, release: threading.Event) -> None:
        # A tenth of a second's worth per piece keeps every read short, so only a deadline
        # on the whole response notices how long it takes. Clearing the faults sends the rest
        # at once.
        piece = max(1, int(rate / 10))
        pause = piece / rate
        view = memoryview(data)
        for start in range(0, len(view), piece):
            if start and not release.is_set():
                release.wait(pause)
            self.wfile.write(view[start : start + piece])

    def _healthz(self, body: bytes) -> tuple[int, object]:
        return 200, {"ok": True}

    def _get_stats(self, body: bytes) -> tuple[int, object]:
        # Batches that have ended since they were last looked at are charged first.
        self._srv.batches.advance()
        return 200, self._srv.stats.snapshot()

    def _get_arrivals(self, body: bytes) -> tuple[int, object]:
        return 200, {"arrivals": self._srv.stats.arrivals()}

    def _reset_stats(self, body: bytes) -> tuple[int, object]:
        self._srv.reset_stats()
        return 200, self._srv.stats.snapshot()

    def _get_faults(self, body: bytes) -> tuple[int, object]:
        return 200, self._srv.faults.to_json()

    def _put_faults(self, body: bytes) -> tuple[int, object]:
        try:
            config = FaultConfig.from_json(json.loads(body) if body.strip() else {})
        except (ValueError, RecursionError) as exc:
            raise HttpError(400, f"invalid fault config: {exc}") from None
        self._srv.set_faults(config)
        return 200, config.to_json()

    def _delete_faults(self, body: bytes) -> tuple[int, object]:
        self._srv.clear_faults()
        return 200, self._srv.faults.to_json()


_Route = Callable[[Handler, bytes], tuple[int, object]]
_ROUTES: dict[str, dict[str, _Route]] = {
    "/healthz": {"GET": Handler._healthz},
    "/stats": {"GET": Handler._get_stats},
    "/stats/arrivals": {"GET": Handler._get_arrivals},
    "/stats/reset": {"POST": Handler._reset_stats},
    "/faults": {
        "GET": Handler._get_faults,
        "PUT": Handler._put_faults,
        "POST": Handler._put_faults,
        "DELETE": Handler._delete_faults,
    },
}
