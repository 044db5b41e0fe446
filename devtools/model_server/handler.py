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
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from devtools.model_server.batches import ApiCall, is_files_or_batches_path
from devtools.model_server.chat import chat_response, parse_chat_request
from devtools.model_server.errors import HttpError
from devtools.model_server.faults import FaultConfig, seconds_header
from devtools.model_server.http_io import JsonHandler, padded
from devtools.model_server.idempotency import fingerprint
from devtools.model_server.limits import MAX_BODY_BYTES, UPLOAD_MAX_BODY_BYTES
from devtools.model_server.ratelimit import OverTokenLimit, pay_tokens
from devtools.model_server.stats import CHAT, EMBEDDINGS, charge_key
from devtools.model_server.vectors import (
    embeddings_response,
    parse_embeddings_request,
    usage_tokens,
)
from devtools.model_server.webhooks import receive

if TYPE_CHECKING:
    from devtools.model_server.ratelimit import TokenBucket
    from devtools.model_server.state import FaultDraw, ServerState
    from devtools.model_server.stats import Ticket

# What serves one admitted model API request: the body to answer with, and if it is lost.
_Work = Callable[["Ticket", "FaultDraw", "str | None"], tuple[bytes, bool]]


class Handler(JsonHandler):
    """One connection's requests, routed by path; every error is answered as JSON.

    It serves the :class:`~devtools.model_server.state.ServerState` its server is.
    """

    server_version = "ReplayableLocalModel/1"

    def version_string(self) -> str:
        return self.server_version

    @property
    def _srv(self) -> ServerState:
        return cast("ServerState", self.server)

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
                key = self.headers.get("Idempotency-Key")
                name = path.removeprefix("/webhooks/")
                self._send_json(*receive(self._srv, self.command, name, key, body))
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
            raise config.injected(config.status_always, "every request fails")
        for needle, poison_status in config.fail_inputs_containing:
            if any(needle in text for text in inputs):
                raise config.injected(poison_status, f"an input contains {needle!r}")
        draw = srv.draw(config)
        if draw.hang:
            faults.release.wait(config.hang_s)
        if draw.status is not None:
            raise config.injected(draw.status, "random failure")
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

        A request whose key is remembered is answered from memory (or refused with 422)
        and costs nothing, so it neither pays nor is refused.
        """
        if faults.tokens is None:
            return None
        if key is not None and faults.config.dedupe and self._srv.stats.remembers(key):
            return None
        return pay_tokens(faults.tokens, tokens)

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
