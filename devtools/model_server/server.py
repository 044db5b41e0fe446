"""Local OpenAI-compatible embeddings server for offline demos and tests.

This server is for offline demos and tests only. Its vectors are feature hashes of the
input's words, not semantic embeddings: texts that share words land close together, but
synonyms, paraphrases and other languages do not. Never use it to judge retrieval quality.

It speaks enough of the OpenAI API (``POST /v1/embeddings``) for the pipeline's provider
client, binds loopback only, and behaves like a careful paid provider: it charges each
successful request, remembers it per ``Idempotency-Key`` and can inject faults at runtime
(error statuses, ``Retry-After``, latency, hangs, poison inputs, lost responses, a
concurrency limit, slow or padded bodies) so retry and replay behaviour can be exercised
without a network or a paid account. It also receives "document ready" webhooks, standing
in for a downstream system.

Idempotency keys
    A successful ``/v1/embeddings`` response is remembered under its ``Idempotency-Key``
    header together with a fingerprint of the request (model, inputs, dimensions,
    encoding). A later request with the same key and the same fingerprint gets the
    remembered body again and is counted as ``deduplicated``, not charged; with a different
    fingerprint it gets 422 ``idempotency_key_reused``. Failed requests are not remembered,
    so their retry is served and charged normally. Requests with one key that are in
    flight at the same time are neither blocked nor refused: the charge is taken
    atomically when a request has embedded its inputs, so the first to get there is
    charged and every other one is answered with the first one's body, exactly as if it
    had waited for it. (A 409 would be terminal to a client that treats other 4xx as
    final, and waiting would tie a retry to a first attempt held by a hang fault.) The
    memory keeps the most recently used :data:`IDEMPOTENCY_MAX_KEYS` keys and at most
    :data:`IDEMPOTENCY_MAX_BYTES` of bodies; a key evicted from it, or whose body alone is
    larger than that, is charged again. ``POST /stats/reset`` forgets every key.

Control endpoints (no API key needed):

- ``GET /healthz``: liveness;
- ``GET /stats``: counters since the last reset, as a JSON object:

  - ``requests``: ``/v1/embeddings`` requests received; ``succeeded`` + ``failed`` of
    them have finished, the rest are ``in_flight``;
  - ``succeeded`` = ``charged`` + ``deduplicated``: 200 responses, newly embedded and
    charged or replayed from an idempotency key;
  - ``failed``: every other response (injected faults, 4xx, 422 key reuse, concurrency
    429s); ``by_status``: responses per status, lost ones included under ``"200"``;
  - ``inputs_embedded`` and ``input_success_counts`` (sha256 of an input's text -> times it
    was charged) count charged inputs only;
  - ``idempotency_keys``: each key seen -> how many times a response under it was charged;
  - ``would_deduplicate``: charged requests whose key had been charged before (whatever
    the body) and was still remembered; non-zero only with ``"dedupe": false``, it is
    what the keys would have saved;
  - ``lost_responses``: 200 responses dropped instead of sent (``lose_response_rate``);
  - ``rejected_concurrency``: 429s from ``max_concurrency``;
  - ``in_flight``: requests being served now (a live gauge, kept by a reset);
    ``peak_in_flight``: the most at once since the last reset, limit or not;
  - ``webhooks``: ``received`` = ``stored`` + ``deduplicated`` + ``failed`` webhook
    deliveries.

- ``POST /stats/reset``: zero the counters, forget remembered idempotency keys and drop
  every stored webhook event; requests that began before it are not counted when they
  finish;
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

Fault config keys (``PUT /faults`` with a JSON object; unknown keys and bad values get 400
naming the key; every key is optional and the default injects nothing):

- ``status_rates``: ``{"503": 0.3, "429": 0.1}``, the share of ``/v1`` requests failing
  with each status (at most 1 in total);
- ``retry_after``: seconds or an HTTP-date sent as ``Retry-After`` on injected 429 and 503
  responses, webhooks included;
- ``latency_ms``: delay before a ``/v1`` request is handled;
- ``hang_rate``, ``hang_s`` (default 600): the share of requests held ``hang_s`` seconds
  (or until the faults are cleared) before they go on;
- ``fail_inputs_containing``: ``{"POISON": 400}``, the status for a request with an input
  containing the substring;
- ``status_always``: fail every ``/v1`` request with this status;
- ``seed``: reseed the fault draws, so a config gives the same sequence every time;
- ``dedupe`` (default true): replay repeated idempotency keys; false charges every
  repeat, answers no 422, and counts ``would_deduplicate``;
- ``lose_response_rate``: the share of 200 responses that are dropped after the work is
  done: the request is charged (or replayed) and its key remembered as usual, then the
  connection is shut down without a response, so the client sees the server disconnect;
- ``max_concurrency``: answer 429 at once, with ``Retry-After:
  concurrency_retry_after`` (seconds, default 1), to an embeddings request that arrives
  while this many are in flight (null: no limit);
- ``trickle_bytes_per_s``: send 200 bodies at about this rate, in pieces of a tenth of it
  (at least one byte), so from 10 bytes/s up a piece arrives every tenth of a second: a
  per-read timeout does not fire while a deadline on the whole response does (0: at once);
- ``pad_response_bytes``: add a ``"padding"`` field of this many characters to 200
  bodies (at most :data:`MAX_PAD_BYTES`), for a client's response-size cap;
- ``webhook_statuses``: ``[503, 503, 200]``, statuses answered to webhook deliveries one
  per delivery, in order, before they succeed normally; 4xx/5xx fail the delivery, a 2xx
  stores it and is the status it and its replays get. Setting the faults restarts the
  list;
- ``webhook_status_always``: fail every webhook delivery with this status.

The server itself uses the standard library only, so it starts fast anywhere.
:class:`LocalModelServer` runs it as a subprocess for tests and demos; it imports ``httpx``
only when started.

Command line::

    python -m devtools.model_server --host 127.0.0.1 --port 0 --dim 64 \\
        [--api-key KEY] [--port-file PATH] [--parent-pid PID] [--verbose]

With ``--parent-pid`` the server exits, as on SIGTERM, once that process is no longer its
parent: the process that started it died, however it died.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import httpx

DEFAULT_DIM = 64
MAX_DIM = 8192
MAX_BODY_BYTES = 16 * 1024 * 1024
API_KEY_ENV = "REPLAYABLE_LOCAL_API_KEY"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
IDEMPOTENCY_MAX_KEYS = 100_000
IDEMPOTENCY_MAX_BYTES = 64 * 1024 * 1024
MAX_PAD_BYTES = 64 * 1024 * 1024
# How often a server tied to its parent checks that the parent is still there (ADR 0079).
PARENT_CHECK_S = 0.5

_TOKEN_RE = re.compile(r"\w+")
_WEBHOOK_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,100}")
_FAULT_FIELDS = frozenset(
    {
        "status_rates",
        "retry_after",
        "latency_ms",
        "hang_rate",
        "hang_s",
        "fail_inputs_containing",
        "status_always",
        "seed",
        "dedupe",
        "lose_response_rate",
        "max_concurrency",
        "concurrency_retry_after",
        "trickle_bytes_per_s",
        "pad_response_bytes",
        "webhook_statuses",
        "webhook_status_always",
    }
)


def _webhook_path(name: str) -> str:
    """Return the path of webhook receiver ``name``; raise ``ValueError`` if it is invalid."""
    if not _WEBHOOK_NAME_RE.fullmatch(name):
        raise ValueError(
            f"invalid webhook name {name!r}: use 1 to 100 of A-Z, a-z, 0-9, '.', '_', '-'"
        )
    return f"/webhooks/{name}"


def require_loopback(host: str) -> str:
    """Return ``host`` if it is a loopback name, else raise ``ValueError`` naming it."""
    if host not in LOOPBACK_HOSTS:
        allowed = ", ".join(sorted(LOOPBACK_HOSTS))
        raise ValueError(f"refusing to bind non-loopback host {host!r}; use one of {allowed}")
    return host


def embed_text(text: str, dim: int = DEFAULT_DIM) -> list[float]:
    """Return the unit-norm feature-hash vector of ``text`` with ``dim`` components.

    Lowercased word tokens are each hashed to a bucket and a sign and summed. A text with
    no tokens (or whose tokens cancel out) gets the fixed unit vector e0, so every vector
    has norm 1 and cosine similarity is always defined.
    """
    if not 1 <= dim <= MAX_DIM:
        raise ValueError(f"dim must be between 1 and {MAX_DIM}, got {dim}")
    vector = [0.0] * dim
    for token in _TOKEN_RE.findall(text.lower()):
        digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
        bucket = int.from_bytes(digest[:4], "big") % dim
        vector[bucket] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if norm == 0.0:
        vector[0] = 1.0
        return vector
    return [x / norm for x in vector]


def count_tokens(text: str) -> int:
    """Return the usage token count of one input: its whitespace tokens, at least 1."""
    return max(1, len(text.split()))


def _error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    if status == 401:
        kind = "authentication_error"
    elif status == 403:
        kind = "permission_error"
    elif status == 404:
        kind = "not_found_error"
    elif status == 429:
        kind = "rate_limit_error"
    elif status >= 500:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _finite_number(raw: Mapping[str, object], key: str, default: float, low: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{key} must be a finite number")
    if value < low:
        raise ValueError(f"{key} must be >= {low}")
    return float(value)


def _probability(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ValueError(f"{key} must be a number between 0 and 1")
    return float(value)


def _error_status(value: object, key: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 400 <= value <= 599:
        raise ValueError(f"{key} must be an HTTP error status between 400 and 599")
    return value


def _webhook_status(value: object, key: str) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not (200 <= value <= 299 or 400 <= value <= 599)
    ):
        raise ValueError(f"{key} must be an HTTP status between 200 and 299 or 400 and 599")
    return value


def _whole_number(raw: Mapping[str, object], key: str, low: int, high: int) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{key} must be an integer between {low} and {high}")
    return value


def _seconds_header(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclass(frozen=True)
class FaultConfig:
    """Faults the server injects, and whether it de-duplicates; the default injects none.

    The module docstring describes each field under its JSON key.
    """

    status_rates: tuple[tuple[int, float], ...] = ()
    retry_after: str | int | float | None = None
    latency_ms: float = 0.0
    hang_rate: float = 0.0
    hang_s: float = 600.0
    fail_inputs_containing: tuple[tuple[str, int], ...] = ()
    status_always: int | None = None
    seed: int | None = None
    dedupe: bool = True
    lose_response_rate: float = 0.0
    max_concurrency: int | None = None
    concurrency_retry_after: float = 1.0
    trickle_bytes_per_s: float = 0.0
    pad_response_bytes: int = 0
    webhook_statuses: tuple[int, ...] = ()
    webhook_status_always: int | None = None

    @classmethod
    def from_json(cls, raw: object) -> FaultConfig:
        """Validate a JSON fault config; raise ``ValueError`` describing the first problem."""
        if not isinstance(raw, dict):
            raise ValueError("fault config must be a JSON object")
        # Unknown keys are usually typos; silently ignoring one would make a test pass for
        # the wrong reason.
        unknown = sorted(set(raw) - _FAULT_FIELDS)
        if unknown:
            raise ValueError(f"unknown fault config keys: {', '.join(unknown)}")

        rates_raw = raw.get("status_rates") or {}
        if not isinstance(rates_raw, dict):
            raise ValueError('status_rates must be an object like {"503": 0.3}')
        rates = tuple(
            (
                _error_status(status, "status_rates key"),
                _probability(rate, f"status_rates[{status}]"),
            )
            for status, rate in rates_raw.items()
        )
        if sum(rate for _, rate in rates) > 1 + 1e-9:
            raise ValueError("status_rates must add up to at most 1")

        retry_after = raw.get("retry_after")
        if isinstance(retry_after, bool) or not (
            retry_after is None
            or (isinstance(retry_after, str) and retry_after.strip())
            or (isinstance(retry_after, int | float) and 0 <= retry_after < math.inf)
        ):
            raise ValueError("retry_after must be seconds (>= 0) or a non-empty HTTP-date string")

        poison_raw = raw.get("fail_inputs_containing") or {}
        if not isinstance(poison_raw, dict) or not all(poison_raw):
            raise ValueError('fail_inputs_containing must be an object like {"POISON": 400}')
        poison = tuple(
            (str(needle), _error_status(status, f"fail_inputs_containing[{needle}]"))
            for needle, status in poison_raw.items()
        )

        status_always = raw.get("status_always")
        if status_always is not None:
            status_always = _error_status(status_always, "status_always")

        seed = raw.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError("seed must be an integer")

        dedupe = raw.get("dedupe", True)
        if not isinstance(dedupe, bool):
            raise ValueError("dedupe must be true or false")

        webhook_raw = raw.get("webhook_statuses") or []
        if not isinstance(webhook_raw, list):
            raise ValueError("webhook_statuses must be a list like [503, 200]")
        webhook_statuses = tuple(
            _webhook_status(status, f"webhook_statuses[{index}]")
            for index, status in enumerate(webhook_raw)
        )

        webhook_status_always = raw.get("webhook_status_always")
        if webhook_status_always is not None:
            webhook_status_always = _error_status(webhook_status_always, "webhook_status_always")

        return cls(
            status_rates=rates,
            retry_after=retry_after,
            latency_ms=_finite_number(raw, "latency_ms", 0.0, 0.0),
            hang_rate=_probability(raw.get("hang_rate", 0.0), "hang_rate"),
            hang_s=_finite_number(raw, "hang_s", 600.0, 0.0),
            fail_inputs_containing=poison,
            status_always=status_always,
            seed=seed,
            dedupe=dedupe,
            lose_response_rate=_probability(
                raw.get("lose_response_rate", 0.0), "lose_response_rate"
            ),
            max_concurrency=_whole_number(raw, "max_concurrency", 1, 1_000_000),
            concurrency_retry_after=_finite_number(raw, "concurrency_retry_after", 1.0, 0.0),
            trickle_bytes_per_s=_finite_number(raw, "trickle_bytes_per_s", 0.0, 0.0),
            pad_response_bytes=_whole_number(raw, "pad_response_bytes", 0, MAX_PAD_BYTES) or 0,
            webhook_statuses=webhook_statuses,
            webhook_status_always=webhook_status_always,
        )

    def to_json(self) -> dict[str, Any]:
        """Return the config as the JSON object ``GET /faults`` shows."""
        return {
            "status_rates": {str(status): rate for status, rate in self.status_rates},
            "retry_after": self.retry_after,
            "latency_ms": self.latency_ms,
            "hang_rate": self.hang_rate,
            "hang_s": self.hang_s,
            "fail_inputs_containing": dict(self.fail_inputs_containing),
            "status_always": self.status_always,
            "seed": self.seed,
            "dedupe": self.dedupe,
            "lose_response_rate": self.lose_response_rate,
            "max_concurrency": self.max_concurrency,
            "concurrency_retry_after": self.concurrency_retry_after,
            "trickle_bytes_per_s": self.trickle_bytes_per_s,
            "pad_response_bytes": self.pad_response_bytes,
            "webhook_statuses": list(self.webhook_statuses),
            "webhook_status_always": self.webhook_status_always,
        }

    def retry_after_header(self) -> str | None:
        """Return the ``Retry-After`` header value, or None when none is configured."""
        value = self.retry_after
        if value is None or isinstance(value, str):
            return value
        return _seconds_header(value)


@dataclass(frozen=True)
class _Remembered:
    fingerprint: str
    body: bytes


class _IdempotencyMemory:
    """Successful response bodies by ``Idempotency-Key``; the least recently used go first.

    Bounded by a number of keys and by bytes (keys, fingerprints and bodies); a body larger
    than the byte bound on its own is not remembered. Not thread-safe by itself: the
    :class:`_Stats` lock guards it.
    """

    def __init__(self, max_keys: int, max_bytes: int) -> None:
        if max_keys < 1 or max_bytes < 1:
            raise ValueError(f"idempotency memory bounds must be >= 1, got {max_keys}, {max_bytes}")
        self._max_keys = max_keys
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, _Remembered] = OrderedDict()
        self._bytes = 0

    @staticmethod
    def _size(key: str, entry: _Remembered) -> int:
        return len(key) + len(entry.fingerprint) + len(entry.body)

    def get(self, key: str) -> _Remembered | None:
        """Return what ``key`` remembers, marking it most recently used; None if nothing."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def remember(self, key: str, entry: _Remembered) -> None:
        """Remember ``entry`` under a new ``key``, evicting the least recently used to fit."""
        size = self._size(key, entry)
        if size > self._max_bytes:
            return
        self._entries[key] = entry
        self._bytes += size
        while len(self._entries) > self._max_keys or self._bytes > self._max_bytes:
            evicted_key, evicted = self._entries.popitem(last=False)
            self._bytes -= self._size(evicted_key, evicted)

    def clear(self) -> None:
        """Forget every key."""
        self._entries.clear()
        self._bytes = 0


@dataclass
class _Ticket:
    """An embeddings request's stats generation, and whether the concurrency limit let it in."""

    generation: int
    admitted: bool
    ended: bool = False


@dataclass(frozen=True)
class _WebhookReply:
    status: int
    payload: dict[str, Any]


class _Stats:
    """Thread-safe counters behind ``GET /stats``, with the idempotency and webhook memory.

    One lock guards all of it, so a charge and the memory that prevents the next one change
    together. Nothing sleeps or does I/O while holding it.
    """

    def __init__(
        self,
        idempotency_max_keys: int = IDEMPOTENCY_MAX_KEYS,
        idempotency_max_bytes: int = IDEMPOTENCY_MAX_BYTES,
    ) -> None:
        self._lock = threading.Lock()
        # A reset bumps the generation; requests that began before it are not counted when
        # they finish, so a request left hanging by one test cannot leak into the next.
        self._generation = 0
        self._in_flight = 0
        self._memory = _IdempotencyMemory(idempotency_max_keys, idempotency_max_bytes)
        self._zero()

    def _zero(self) -> None:
        self._requests = 0
        self._succeeded = 0
        self._charged = 0
        self._deduplicated = 0
        self._would_deduplicate = 0
        self._failed = 0
        self._lost_responses = 0
        self._rejected_concurrency = 0
        self._peak_in_flight = self._in_flight
        self._by_status: dict[str, int] = {}
        self._inputs_embedded = 0
        self._input_success_counts: dict[str, int] = {}
        self._idempotency_keys: dict[str, int] = {}
        self._memory.clear()
        self._webhooks = dict.fromkeys(("received", "stored", "deduplicated", "failed"), 0)
        self._webhook_events: dict[str, list[dict[str, Any]]] = {}
        self._webhook_replies: dict[tuple[str, str], _WebhookReply] = {}

    def _count_status(self, status: int) -> None:
        key = str(status)
        self._by_status[key] = self._by_status.get(key, 0) + 1

    def begin(self, idempotency_key: str | None, max_concurrency: int | None) -> _Ticket:
        """Count a request as started and admit it, unless ``max_concurrency`` are in flight.

        A refused request is counted as a failed 429 here and is never in flight.
        """
        with self._lock:
            self._requests += 1
            if idempotency_key is not None:
                self._idempotency_keys.setdefault(idempotency_key, 0)
            if max_concurrency is not None and self._in_flight >= max_concurrency:
                self._rejected_concurrency += 1
                self._failed += 1
                self._count_status(429)
                return _Ticket(self._generation, admitted=False)
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
            return _Ticket(self._generation, admitted=True)

    def fail(self, ticket: _Ticket, status: int) -> None:
        """Count an error response, unless stats were reset since the request began."""
        with self._lock:
            if ticket.generation != self._generation:
                return
            self._failed += 1
            self._count_status(status)

    def settle(
        self,
        ticket: _Ticket,
        idempotency_key: str | None,
        fingerprint: str,
        input_digests: Sequence[str],
        body: bytes,
        *,
        dedupe: bool,
        lost: bool,
    ) -> bytes | None:
        """Charge a request that embedded its inputs, or replay what its key remembers.

        Return the body to answer with: ``body`` when the request is charged, the first
        response's body when it is replayed, or None when the key was charged for a request
        with another fingerprint (the caller answers 422 and counts it with :meth:`fail`).
        With ``dedupe`` off every request is charged. ``lost`` counts the response as
        dropped. A request begun before a reset is neither counted nor remembered.
        """
        with self._lock:
            if ticket.generation != self._generation:
                return body
            remembered = self._memory.get(idempotency_key) if idempotency_key else None
            if dedupe and remembered is not None:
                if remembered.fingerprint != fingerprint:
                    return None
                self._deduplicated += 1
                body = remembered.body
            else:
                self._charged += 1
                self._inputs_embedded += len(input_digests)
                for digest in input_digests:
                    self._input_success_counts[digest] = (
                        self._input_success_counts.get(digest, 0) + 1
                    )
                if idempotency_key is not None:
                    count = self._idempotency_keys.get(idempotency_key, 0)
                    self._idempotency_keys[idempotency_key] = count + 1
                    if remembered is None:
                        self._memory.remember(idempotency_key, _Remembered(fingerprint, body))
                    else:
                        self._would_deduplicate += 1
            self._succeeded += 1
            self._count_status(200)
            if lost:
                self._lost_responses += 1
            return body

    def end(self, ticket: _Ticket) -> None:
        """Count an admitted request as no longer in flight (once; later calls do nothing).

        A request leaves the count when its answer starts going out, as at a provider that
        limits requests being processed: a client that has read a whole answer may send the
        next request at once and must find its slot free.
        """
        with self._lock:
            if not ticket.admitted or ticket.ended:
                return
            ticket.ended = True
            self._in_flight -= 1

    def store_webhook(self, name: str, key: str, event: object, status: int) -> _WebhookReply:
        """Store a webhook event under ``(name, key)`` once; return the reply for its key.

        The first delivery with a key is stored and answered ``status``; later ones get the
        first delivery's reply and are not stored.
        """
        received_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        with self._lock:
            self._webhooks["received"] += 1
            reply = self._webhook_replies.get((name, key))
            if reply is not None:
                self._webhooks["deduplicated"] += 1
                return reply
            events = self._webhook_events.setdefault(name, [])
            events.append({"key": key, "body": event, "received_at": received_at})
            payload = {"ok": True, "name": name, "key": key, "event": len(events)}
            reply = self._webhook_replies[(name, key)] = _WebhookReply(status, payload)
            self._webhooks["stored"] += 1
            return reply

    def fail_webhook(self) -> None:
        """Count a webhook delivery that got an error response."""
        with self._lock:
            self._webhooks["received"] += 1
            self._webhooks["failed"] += 1

    def webhook_events(self, name: str) -> list[dict[str, Any]]:
        """Return the events stored for webhook ``name``, in arrival order."""
        with self._lock:
            # Stored events are never changed, so a shallow copy is a consistent snapshot.
            return list(self._webhook_events.get(name, ()))

    def reset(self) -> None:
        """Zero every counter except the live ``in_flight`` gauge and forget all memory."""
        with self._lock:
            self._generation += 1
            self._zero()

    def snapshot(self) -> dict[str, Any]:
        """Return the counters as the JSON object ``GET /stats`` shows."""
        with self._lock:
            return {
                "requests": self._requests,
                "succeeded": self._succeeded,
                "charged": self._charged,
                "deduplicated": self._deduplicated,
                "would_deduplicate": self._would_deduplicate,
                "failed": self._failed,
                "lost_responses": self._lost_responses,
                "rejected_concurrency": self._rejected_concurrency,
                "by_status": dict(self._by_status),
                "inputs_embedded": self._inputs_embedded,
                "input_success_counts": dict(self._input_success_counts),
                "idempotency_keys": dict(self._idempotency_keys),
                "in_flight": self._in_flight,
                "peak_in_flight": self._peak_in_flight,
                "webhooks": dict(self._webhooks),
            }


@dataclass(frozen=True)
class _FaultDraw:
    config: FaultConfig
    release: threading.Event


@dataclass(frozen=True)
class _Draw:
    """What the fault dice decided for one request."""

    hang: bool
    status: int | None
    lose: bool


class _HttpError(Exception):
    """An error response; ``injected`` marks one caused by the fault config."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})


@dataclass(frozen=True)
class _EmbeddingsRequest:
    model: str
    inputs: list[str]
    dim: int
    encoding_format: str


def _parse_embeddings_request(body: bytes, default_dim: int) -> _EmbeddingsRequest:
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _HttpError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise _HttpError(400, "request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _HttpError(400, "'model' must be a non-empty string")
    raw_input = payload.get("input")
    if isinstance(raw_input, str):
        inputs = [raw_input]
    elif isinstance(raw_input, list) and all(isinstance(item, str) for item in raw_input):
        inputs = cast("list[str]", raw_input)
    else:
        raise _HttpError(400, "'input' must be a string or a list of strings")
    if not inputs or not all(inputs):
        raise _HttpError(400, "'input' must not be empty and must not contain empty strings")
    encoding_format = payload.get("encoding_format", "float")
    if encoding_format not in ("float", "base64"):
        raise _HttpError(400, "'encoding_format' must be 'float' or 'base64'")
    dim = payload.get("dimensions", default_dim)
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_DIM:
        raise _HttpError(400, f"'dimensions' must be an integer between 1 and {MAX_DIM}")
    return _EmbeddingsRequest(model, inputs, dim, cast("str", encoding_format))


def _fingerprint(request: _EmbeddingsRequest) -> str:
    """Return what identifies a request for its idempotency key: what it asks, not its bytes."""
    canonical = json.dumps(
        [request.model, request.inputs, request.dim, request.encoding_format],
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _padded(body: bytes, size: int) -> bytes:
    """Return the JSON object ``body`` with a ``padding`` field of ``size`` characters added."""
    if size <= 0:
        return body
    return b"".join((body[:-1], b',"padding":"', b"x" * size, b'"}'))


def _embeddings_response(request: _EmbeddingsRequest) -> dict[str, Any]:
    data: list[dict[str, Any]] = []
    for index, text in enumerate(request.inputs):
        vector = embed_text(text, request.dim)
        embedding: list[float] | str = vector
        if request.encoding_format == "base64":
            # The OpenAI Python client asks for base64 by default: little-endian float32.
            packed = struct.pack(f"<{len(vector)}f", *vector)
            embedding = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = sum(count_tokens(text) for text in request.inputs)
    return {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


class EmbeddingServer(ThreadingHTTPServer):
    """A threading HTTP server for the embeddings API; binds loopback hosts only.

    ``idempotency_max_keys`` and ``idempotency_max_bytes`` bound the memory of responses
    kept for repeated ``Idempotency-Key`` headers.
    """

    # Hung requests sleep in their own threads; neither shutdown nor exit may wait for them.
    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        dim: int = DEFAULT_DIM,
        api_key: str | None = None,
        verbose: bool = False,
        idempotency_max_keys: int = IDEMPOTENCY_MAX_KEYS,
        idempotency_max_bytes: int = IDEMPOTENCY_MAX_BYTES,
    ) -> None:
        require_loopback(host)
        if not 1 <= dim <= MAX_DIM:
            raise ValueError(f"dim must be between 1 and {MAX_DIM}, got {dim}")
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.dim = dim
        self.api_key = api_key or None
        self.verbose = verbose
        self.stats = _Stats(idempotency_max_keys, idempotency_max_bytes)
        self._faults_lock = threading.Lock()
        self._faults = FaultConfig()
        self._webhook_statuses: deque[int] = deque()
        self._rng = random.Random(0)  # noqa: S311 - fault draws must be reproducible
        self._release = threading.Event()
        super().__init__((host, port), _Handler)

    def server_bind(self) -> None:
        """Bind without the reverse DNS lookup ``HTTPServer`` does, which can stall startup."""
        socketserver.TCPServer.server_bind(self)
        host, port = self.socket.getsockname()[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    @property
    def url(self) -> str:
        """Return the root URL the server answers on, e.g. ``http://127.0.0.1:8000``."""
        host = f"[{self.server_name}]" if ":" in self.server_name else self.server_name
        return f"http://{host}:{self.server_port}"

    @property
    def faults(self) -> FaultConfig:
        """Return the current fault config."""
        with self._faults_lock:
            return self._faults

    def set_faults(self, config: FaultConfig) -> None:
        """Replace the fault config and restart its webhook statuses; reseed if it has a seed."""
        with self._faults_lock:
            self._faults = config
            self._webhook_statuses = deque(config.webhook_statuses)
            if config.seed is not None:
                self._rng.seed(config.seed)

    def clear_faults(self) -> None:
        """Remove every fault and release requests held by injected latency or hangs."""
        with self._faults_lock:
            self._faults = FaultConfig()
            self._webhook_statuses = deque()
            self._release.set()
            self._release = threading.Event()

    def snapshot_faults(self) -> _FaultDraw:
        """Return the config a request runs under and the event that releases its waits."""
        with self._faults_lock:
            return _FaultDraw(self._faults, self._release)

    def draw(self, config: FaultConfig) -> _Draw:
        """Draw whether a request hangs, which status it fails with, if any, and if it is lost."""
        # Each draw is taken only when its rate is set, so adding a fault kind leaves the
        # sequences that existing seeds give unchanged.
        with self._faults_lock:
            hang = config.hang_rate > 0 and self._rng.random() < config.hang_rate
            status_draw = self._rng.random() if config.status_rates else None
            lose = config.lose_response_rate > 0 and self._rng.random() < config.lose_response_rate
        status = None
        if status_draw is not None:
            cumulative = 0.0
            for candidate, rate in config.status_rates:
                cumulative += rate
                if status_draw < cumulative:
                    status = candidate
                    break
        return _Draw(hang, status, lose)

    def next_webhook_status(self) -> tuple[FaultConfig, int | None]:
        """Return the fault config and the status it sets for the next webhook, if any."""
        with self._faults_lock:
            config = self._faults
            if config.webhook_status_always is not None:
                return config, config.webhook_status_always
            if self._webhook_statuses:
                return config, self._webhook_statuses.popleft()
            return config, None


class _Handler(BaseHTTPRequestHandler):
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
        path = urlsplit(self.path).path
        try:
            if path == "/v1/embeddings" and self.command == "POST":
                self._embeddings()
                return
            body = self._read_body()
            if path.startswith("/webhooks/"):
                self._webhook(path.removeprefix("/webhooks/"), body)
                return
            if path == "/v1" or path.startswith("/v1/"):
                self._wait_latency(self._srv.snapshot_faults())
                self._check_auth()
                raise _HttpError(404, f"unknown endpoint {self.command} {path}")
            methods = _ROUTES.get(path)
            if methods is None:
                raise _HttpError(404, f"unknown endpoint {path}")
            route = methods.get(self.command)
            if route is None:
                allow = ", ".join(sorted(methods))
                raise _HttpError(405, f"use {allow} on {path}", headers={"Allow": allow})
            status, payload = route(self, body)
            self._send_json(status, payload)
        except _HttpError as exc:
            self._send_error(exc)

    def _embeddings(self) -> None:
        srv = self._srv
        key = self.headers.get("Idempotency-Key") or None
        faults = srv.snapshot_faults()
        config = faults.config
        ticket = srv.stats.begin(key, config.max_concurrency)
        try:
            if not ticket.admitted:
                self._refuse_over_limit(config)
                return
            try:
                body, lost = self._embed(ticket, faults, key)
            except _HttpError as exc:
                srv.stats.fail(ticket, exc.status)
                srv.stats.end(ticket)
                self._send_error(exc)
            except Exception:
                traceback.print_exc(file=sys.stderr)
                srv.stats.fail(ticket, 500)
                srv.stats.end(ticket)
                self._send_error(_HttpError(500, "internal error in the local model server"))
            else:
                if lost:
                    srv.stats.end(ticket)
                    self._drop_connection()
                else:
                    body = _padded(body, config.pad_response_bytes)
                    if not config.trickle_bytes_per_s:
                        srv.stats.end(ticket)
                    self._send_body(
                        200, body, trickle=config.trickle_bytes_per_s, release=faults.release
                    )
        finally:
            srv.stats.end(ticket)

    def _embed(self, ticket: _Ticket, faults: _FaultDraw, key: str | None) -> tuple[bytes, bool]:
        """Serve one embeddings request; return the body to answer with and if it is lost."""
        srv = self._srv
        body = self._read_body()
        config = faults.config
        self._wait_latency(faults)
        self._check_auth()
        if config.status_always is not None:
            raise self._injected(config, config.status_always, "every request fails")
        request = _parse_embeddings_request(body, srv.dim)
        for needle, poison_status in config.fail_inputs_containing:
            if any(needle in text for text in request.inputs):
                raise self._injected(config, poison_status, f"an input contains {needle!r}")
        draw = srv.draw(config)
        if draw.hang:
            faults.release.wait(config.hang_s)
        if draw.status is not None:
            raise self._injected(config, draw.status, "random failure")
        response = json.dumps(_embeddings_response(request), separators=(",", ":")).encode()
        digests = [hashlib.sha256(text.encode()).hexdigest() for text in request.inputs]
        answer = srv.stats.settle(
            ticket,
            key,
            _fingerprint(request),
            digests,
            response,
            dedupe=config.dedupe,
            lost=draw.lose,
        )
        if answer is None:
            raise _HttpError(
                422,
                f"Idempotency-Key {key!r} was already used for a different request; "
                "send a new key with a new request",
                code="idempotency_key_reused",
            )
        return answer, draw.lose

    def _refuse_over_limit(self, config: FaultConfig) -> None:
        # The body is read even though it is refused, to keep the connection usable.
        with contextlib.suppress(_HttpError):
            self._read_body()
        self._send_error(
            _HttpError(
                429,
                f"too many concurrent requests: at most {config.max_concurrency} at once",
                code="concurrency_limit_exceeded",
                headers={"Retry-After": _seconds_header(config.concurrency_retry_after)},
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
            raise _HttpError(404, f"unknown endpoint /webhooks/{name}")
        if self.command == "GET":
            events = srv.stats.webhook_events(name)
            self._send_json(200, {"name": name, "events": events})
            return
        if self.command != "POST":
            raise _HttpError(
                405, f"use GET, POST on /webhooks/{name}", headers={"Allow": "GET, POST"}
            )
        try:
            key = self.headers.get("Idempotency-Key")
            if not key:
                raise _HttpError(
                    400, "an Idempotency-Key header is required", code="missing_idempotency_key"
                )
            try:
                event = json.loads(body)
            except (ValueError, RecursionError) as exc:
                raise _HttpError(400, f"request body is not valid JSON: {exc}") from None
            config, status = srv.next_webhook_status()
            if status is not None and status >= 400:
                raise self._injected(config, status, "webhook delivery")
            reply = srv.stats.store_webhook(name, key, event, status or 200)
        except _HttpError:
            srv.stats.fail_webhook()
            raise
        self._send_json(reply.status, reply.payload)

    def _injected(self, config: FaultConfig, status: int, reason: str) -> _HttpError:
        headers: dict[str, str] = {}
        retry_after = config.retry_after_header()
        if status in (429, 503) and retry_after is not None:
            headers["Retry-After"] = retry_after
        return _HttpError(
            status, f"injected fault: HTTP {status} ({reason})", code="injected", headers=headers
        )

    def _wait_latency(self, faults: _FaultDraw) -> None:
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
            raise _HttpError(
                401,
                "missing or incorrect API key in the Authorization: Bearer header",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    def _read_body(self) -> bytes:
        # The body must be consumed even when the request is refused, or the next request on
        # this keep-alive connection would be parsed from its leftovers.
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise _HttpError(411, "chunked request bodies are not supported; send Content-Length")
        raw_length = self.headers.get("Content-Length", "0")
        try:
            length = int(raw_length)
        except ValueError:
            self.close_connection = True
            raise _HttpError(400, f"invalid Content-Length {raw_length!r}") from None
        if length < 0:
            self.close_connection = True
            raise _HttpError(400, f"invalid Content-Length {raw_length!r}")
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise _HttpError(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        return self.rfile.read(length) if length else b""

    def _send_error(self, exc: _HttpError) -> None:
        self._send_json(exc.status, _error_body(exc.status, exc.message, exc.code), exc.headers)

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
        trickle: float = 0.0,
        release: threading.Event | None = None,
    ) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
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
        return 200, self._srv.stats.snapshot()

    def _reset_stats(self, body: bytes) -> tuple[int, object]:
        self._srv.stats.reset()
        return 200, self._srv.stats.snapshot()

    def _get_faults(self, body: bytes) -> tuple[int, object]:
        return 200, self._srv.faults.to_json()

    def _put_faults(self, body: bytes) -> tuple[int, object]:
        try:
            config = FaultConfig.from_json(json.loads(body) if body.strip() else {})
        except (ValueError, RecursionError) as exc:
            raise _HttpError(400, f"invalid fault config: {exc}") from None
        self._srv.set_faults(config)
        return 200, config.to_json()

    def _delete_faults(self, body: bytes) -> tuple[int, object]:
        self._srv.clear_faults()
        return 200, self._srv.faults.to_json()


_Route = Callable[[_Handler, bytes], tuple[int, object]]
_ROUTES: dict[str, dict[str, _Route]] = {
    "/healthz": {"GET": _Handler._healthz},
    "/stats": {"GET": _Handler._get_stats},
    "/stats/reset": {"POST": _Handler._reset_stats},
    "/faults": {
        "GET": _Handler._get_faults,
        "PUT": _Handler._put_faults,
        "POST": _Handler._put_faults,
        "DELETE": _Handler._delete_faults,
    },
}


def _write_port_file(path: Path, port: int) -> None:
    # Readers poll for this file; a rename makes it appear complete or not at all.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, path)


def serve(
    host: str = "127.0.0.1",
    port: int = 0,
    dim: int = DEFAULT_DIM,
    api_key: str | None = None,
    port_file: str | os.PathLike[str] | None = None,
    verbose: bool = False,
    parent_pid: int | None = None,
) -> None:
    """Run the server until SIGTERM or SIGINT, then shut it down cleanly.

    Prints ``listening on URL`` once it accepts connections and, if ``port_file`` is given,
    writes the port there atomically (and removes the file on exit). Signal handlers are
    only installed when called from the main thread. With ``parent_pid`` it also stops
    once that process is no longer its parent (checked every :data:`PARENT_CHECK_S`).
    """
    server = EmbeddingServer(host, port, dim=dim, api_key=api_key, verbose=verbose)
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    port_path = Path(port_file) if port_file is not None else None
    # serve_forever runs in a thread because shutdown() blocks until it returns, so it
    # cannot be called from the thread (here: the signal handler's) that runs it.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="serve", daemon=True
    )
    try:
        thread.start()
        if port_path is not None:
            _write_port_file(port_path, server.server_port)
        print(f"listening on {server.url}", flush=True)
        # A parent that dies is replaced by init or a subreaper, so a changed parent pid
        # means it is gone, even if its pid is reused since. (PR_SET_PDEATHSIG would fire
        # when the *thread* that started this server ends, and is Linux only.)
        while not stop.wait(PARENT_CHECK_S if parent_pid is not None else None):
            if os.getppid() != parent_pid:
                print(f"parent {parent_pid} is gone; stopping", flush=True)
                break
        server.shutdown()
    finally:
        server.server_close()
        for restored, handler in previous.items():
            signal.signal(restored, handler)
        if port_path is not None:
            port_path.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line and run :func:`serve`; return the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m devtools.model_server",
        description="Local OpenAI-compatible embeddings server for offline demos and tests "
        "(feature-hash vectors, not semantic embeddings).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback host to bind")
    parser.add_argument("--port", type=int, default=0, help="port to bind; 0 picks a free one")
    parser.add_argument("--dim", type=int, default=DEFAULT_DIM, help="default vector size")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV) or None,
        help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV})",
    )
    parser.add_argument("--port-file", help="write the bound port to this file once listening")
    parser.add_argument(
        "--parent-pid", type=int, help="exit once this process is no longer the parent"
    )
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    if not 1 <= args.dim <= MAX_DIM:
        parser.error(f"--dim must be between 1 and {MAX_DIM}")
    try:
        serve(
            args.host,
            args.port,
            args.dim,
            args.api_key,
            args.port_file,
            args.verbose,
            args.parent_pid,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return 0


class LocalModelServer:
    """Run the local embeddings server as a subprocess, e.g. ``with LocalModelServer() as s``.

    The subprocess gets its own process group so :meth:`stop` can take down everything it
    started. The API key is passed through the environment so it never shows in ``ps``.

    :param tie_to_parent: the server exits when this process dies, even by SIGKILL, so a
        crashed test or demo leaves no server behind. ``make start`` turns it off: there the
        server outlives the command that started it until ``make stop``.
    """

    def __init__(
        self,
        dim: int = DEFAULT_DIM,
        api_key: str | None = None,
        port: int = 0,
        port_file: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        *,
        startup_timeout: float = 15.0,
        verbose: bool = False,
        tie_to_parent: bool = True,
    ) -> None:
        self.dim = dim
        self.tie_to_parent = tie_to_parent
        self.api_key = api_key
        self._requested_port = port
        self._port_file = Path(port_file) if port_file is not None else None
        self._log_path = Path(log_path) if log_path is not None else None
        self._startup_timeout = startup_timeout
        self._verbose = verbose
        self._proc: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._tmpdir: Path | None = None
        self._client: httpx.Client | None = None

    @property
    def port(self) -> int:
        """Return the port the running server listens on."""
        if self._port is None:
            raise RuntimeError("LocalModelServer is not running; call start() first")
        return self._port

    @property
    def root_url(self) -> str:
        """Return the server's root URL, e.g. ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """Return the OpenAI-style base URL, which ends in ``/v1``."""
        return f"{self.root_url}/v1"

    @property
    def pid(self) -> int:
        """Return the server's process id, which is also its process group id."""
        if self._proc is None:
            raise RuntimeError("LocalModelServer is not running; call start() first")
        return self._proc.pid

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> LocalModelServer:
        """Start the subprocess and wait until it answers ``/healthz``; no-op if running."""
        if self._proc is not None:
            return self
        import httpx

        if self._port_file is None or self._log_path is None:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="replayable-local-model-"))
        port_file = self._port_file or cast(Path, self._tmpdir) / "port"
        # A port file left by an earlier run would point the readiness check at a dead port.
        port_file.unlink(missing_ok=True)
        log_path = self._log_path or cast(Path, self._tmpdir) / "server.log"
        # The repository root, where ``devtools`` lives (a source checkout; never installed).
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
        # An inherited key would silently switch on auth that the caller did not ask for.
        env.pop(API_KEY_ENV, None)
        if self.api_key:
            env[API_KEY_ENV] = self.api_key
        cmd = [
            sys.executable,
            "-m",
            "devtools.model_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self._requested_port),
            "--dim",
            str(self.dim),
            "--port-file",
            str(port_file),
        ]
        if self._verbose:
            cmd.append("--verbose")
        if self.tie_to_parent:
            cmd += ["--parent-pid", str(os.getpid())]
        with log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Loopback traffic must not be routed through a proxy taken from the environment.
        self._client = httpx.Client(trust_env=False, timeout=10.0)
        try:
            self._port = self._wait_ready(port_file, log_path)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, port_file: Path, log_path: Path) -> int:
        import httpx

        assert self._proc is not None and self._client is not None
        deadline = time.monotonic() + self._startup_timeout
        while time.monotonic() < deadline:
            returncode = self._proc.poll()
            if returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"local model server exited with code {returncode} during startup:\n{tail}"
                )
            with contextlib.suppress(OSError, ValueError):
                port = int(port_file.read_text().strip())
                with contextlib.suppress(httpx.HTTPError):
                    response = self._client.get(f"http://127.0.0.1:{port}/healthz", timeout=1.0)
                    if response.status_code == 200:
                        return port
            time.sleep(0.05)
        raise TimeoutError(
            f"local model server did not become healthy within {self._startup_timeout} s"
        )

    def stop(self) -> None:
        """Stop the server: SIGTERM its process group, then SIGKILL after 5 s; idempotent."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        finally:
            self._port = None
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._tmpdir is not None:
                shutil.rmtree(self._tmpdir, ignore_errors=True)
                self._tmpdir = None

    def _control(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        if self._client is None:
            raise RuntimeError("LocalModelServer is not running; call start() first")
        response = self._client.request(method, f"{self.root_url}{path}", json=body)
        if response.status_code == 400:
            raise ValueError(response.json()["error"]["message"])
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        """Return the server's ``GET /stats`` counters."""
        return cast("dict[str, Any]", self._control("GET", "/stats"))

    def reset_stats(self) -> None:
        """Zero the counters, forget idempotency keys and drop webhook events.

        ``in_flight`` is a live gauge and stays.
        """
        self._control("POST", "/stats/reset")

    def faults(self) -> dict[str, Any]:
        """Return the server's current fault config."""
        return cast("dict[str, Any]", self._control("GET", "/faults"))

    def set_faults(
        self, config: Mapping[str, Any] | None = None, /, **fields: Any
    ) -> dict[str, Any]:
        """Replace the fault config, given as a mapping, keywords or both; return it.

        Raises ``ValueError`` with the server's message when the config is invalid.
        """
        merged = {**(config or {}), **fields}
        return cast("dict[str, Any]", self._control("PUT", "/faults", merged))

    def clear_faults(self) -> None:
        """Remove every fault and release requests held by latency, hangs or trickling."""
        self._control("DELETE", "/faults")

    def webhook_url(self, name: str) -> str:
        """Return the URL of webhook receiver ``name``; raise ``ValueError`` if it is invalid."""
        return f"{self.root_url}{_webhook_path(name)}"

    def webhook_events(self, name: str) -> list[dict[str, Any]]:
        """Return the events webhook ``name`` stored, oldest first: key, body, received_at."""
        response = self._control("GET", _webhook_path(name))
        return cast("list[dict[str, Any]]", response["events"])
