"""The counters behind ``GET /stats``, with the idempotency and webhook memory.

``GET /stats`` shows the counters since the last reset, as a JSON object:

- ``requests``: ``/v1/embeddings`` and ``/v1/chat/completions`` requests received;
  ``succeeded`` + ``failed`` of them have finished, the rest are ``in_flight``. Every
  counter below counts both endpoints' requests alike unless it says otherwise;
- ``by_endpoint``: ``{"embeddings": n, "chat": n}``, the ``requests`` to each endpoint
  (both keys always present);
- ``succeeded`` = ``charged`` + ``deduplicated``: 200 responses, newly answered and
  charged or replayed from an idempotency key;
- ``chat_charged``: the charged responses that answered a chat request (chat refusals
  included), so ``charged - chat_charged`` are embeddings;
- ``failed``: every other response (injected faults, 4xx, 422 key reuse, concurrency
  and token limit 429s); ``by_status``: responses per status, lost ones included under
  ``"200"``;
- ``inputs_embedded`` and ``input_success_counts`` (sha256 of an input's text -> times it
  was charged) count charged embeddings inputs only, never chat messages;
- ``tokens_charged``: the ``usage.total_tokens`` of charged responses, summed (a chat
  answer's prompt and completion tokens both; replays are not charged, and a failed
  request is not charged whatever ``max_tpm`` took for it);
- ``embedding_charges``: ``"model/dimensions/sha256 of the input"`` -> times that input was
  charged under that model and ``dimensions``, synchronously or in a batch's output, so that
  an input bought twice per model and dimensions shows 2 whatever bought it;
  ``lost_embedding_charges``: the same keys, counting charges whose response was lost
  (``lose_response_rate``): the client never learned it had paid for them;
- ``idempotency_keys``: each key seen -> how many times a response under it was charged;
- ``would_deduplicate``: charged requests whose key had been charged before (whatever
  the body) and was still remembered; non-zero only with ``"dedupe": false``, it is
  what the keys would have saved;
- ``lost_responses``: 200 responses dropped instead of sent (``lose_response_rate``);
- ``rejected_concurrency``: 429s from ``max_concurrency``;
- ``rejected_tpm``: 429s from ``max_tpm``, both to requests the token bucket could not
  pay for yet and to requests larger than the whole limit;
- ``in_flight``: requests being served now (a live gauge, kept by a reset);
- ``GET /stats/arrivals`` (not in ``/stats``, which tests poll): when each of the last
  ``ARRIVALS_KEPT`` ``requests`` arrived, in seconds on the server's monotonic clock, so a
  test can tell the rate the provider saw from the provider's own times;
  ``peak_in_flight``: the most at once since the last reset, limit or not;
- ``webhooks``: ``received`` = ``stored`` + ``deduplicated`` + ``failed`` webhook
  deliveries.

The Files and Batch API (:mod:`~devtools.model_server.batches`) is counted apart: none of
the counters above counts its requests or its charges, so a test can tell what was embedded
synchronously from what was embedded in batches:

- ``files_uploaded``: ``POST /v1/files`` uploads stored, those whose response was lost
  included; ``upload_responses_lost``: those (``lose_upload_responses``);
- ``files_stored``: the files stored now (a gauge): uploads not deleted, and the output and
  error files of ended batches;
- ``batches_created``: ``POST /v1/batches`` that made a batch, whatever became of it;
- ``batch_lines_charged``: the batch lines charged, those in an output file (and those a
  completed batch lost, below): a line is charged when its batch ends (completed, expired
  or cancelled), never when it failed or was not done; ``batch_inputs_charged`` and
  ``batch_tokens_charged``: their embedding inputs and ``usage.total_tokens``, summed;
- ``batch_line_charges``: ``custom_id`` -> times a line with it was charged, over every
  batch, so that a line charged in two batches shows 2;
- ``batch_lines_lost``: the charged lines a completed batch wrote to no file
  (``batch_lose_lines_rate``); they are in the counters above, charged like the rest, and
  not in ``lost_embedding_charges``, which counts lost ``/v1`` responses only.

``POST /stats/reset`` drops every stored file and batch with the counters.
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from devtools.model_server.idempotency import (
    IDEMPOTENCY_MAX_BYTES,
    IDEMPOTENCY_MAX_KEYS,
    IdempotencyMemory,
    Remembered,
)

EMBEDDINGS: Final = "embeddings"
CHAT: Final = "chat"
ENDPOINTS = (EMBEDDINGS, CHAT)
# The arrival times kept for GET /stats/arrivals: the newest, enough for any one test.
ARRIVALS_KEPT: Final = 100_000


@dataclass
class Ticket:
    """A ``/v1`` request's stats generation and endpoint, and if the concurrency limit let it in."""

    generation: int
    admitted: bool
    endpoint: str
    ended: bool = False


@dataclass(frozen=True)
class Settled:
    """The body a charged or replayed ``/v1`` request is answered with."""

    body: bytes
    replayed: bool


@dataclass(frozen=True)
class WebhookReply:
    """The status and body a webhook key was answered with, for its replays."""

    status: int
    payload: dict[str, Any]


class Stats:
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
        self._memory = IdempotencyMemory(idempotency_max_keys, idempotency_max_bytes)
        self._zero()

    def _zero(self) -> None:
        self._requests = 0
        self._arrivals: collections.deque[float] = collections.deque(maxlen=ARRIVALS_KEPT)
        self._succeeded = 0
        self._charged = 0
        self._chat_charged = 0
        self._by_endpoint = dict.fromkeys(ENDPOINTS, 0)
        self._deduplicated = 0
        self._would_deduplicate = 0
        self._failed = 0
        self._lost_responses = 0
        self._rejected_concurrency = 0
        self._rejected_tpm = 0
        self._peak_in_flight = self._in_flight
        self._by_status: dict[str, int] = {}
        self._inputs_embedded = 0
        self._tokens_charged = 0
        self._input_success_counts: dict[str, int] = {}
        self._embedding_charges: dict[str, int] = {}
        self._lost_embedding_charges: dict[str, int] = {}
        self._idempotency_keys: dict[str, int] = {}
        self._memory.clear()
        self._webhooks = dict.fromkeys(("received", "stored", "deduplicated", "failed"), 0)
        self._webhook_events: dict[str, list[dict[str, Any]]] = {}
        self._webhook_replies: dict[tuple[str, str], WebhookReply] = {}
        self._files_uploaded = 0
        self._upload_responses_lost = 0
        self._files_stored = 0
        self._batches_created = 0
        self._batch_lines_charged = 0
        self._batch_inputs_charged = 0
        self._batch_tokens_charged = 0
        self._batch_line_charges: dict[str, int] = {}
        self._batch_lines_lost = 0

    def _count_status(self, status: int) -> None:
        key = str(status)
        self._by_status[key] = self._by_status.get(key, 0) + 1

    def begin(
        self, idempotency_key: str | None, max_concurrency: int | None, endpoint: str
    ) -> Ticket:
        """Count a request as started and admit it, unless ``max_concurrency`` are in flight.

        ``endpoint`` is one of :data:`ENDPOINTS`; requests to either count toward the limit.
        A refused request is counted as a failed 429 here and is never in flight.
        """
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; expected one of {ENDPOINTS}")
        with self._lock:
            self._requests += 1
            self._arrivals.append(time.monotonic())
            self._by_endpoint[endpoint] += 1
            if idempotency_key is not None:
                self._idempotency_keys.setdefault(idempotency_key, 0)
            if max_concurrency is not None and self._in_flight >= max_concurrency:
                self._rejected_concurrency += 1
                self._failed += 1
                self._count_status(429)
                return Ticket(self._generation, admitted=False, endpoint=endpoint)
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
            return Ticket(self._generation, admitted=True, endpoint=endpoint)

    def fail(self, ticket: Ticket, status: int, *, over_tpm: bool = False) -> None:
        """Count an error response, unless stats were reset since the request began.

        ``over_tpm`` counts it as refused by the ``max_tpm`` limit too.
        """
        with self._lock:
            if ticket.generation != self._generation:
                return
            self._failed += 1
            self._count_status(status)
            if over_tpm:
                self._rejected_tpm += 1

    def remembers(self, idempotency_key: str) -> bool:
        """Whether a response is remembered under ``idempotency_key``, to replay or refuse.

        With ``dedupe`` on, a request with this key will be answered from memory or with 422,
        unless the key is forgotten meanwhile (a reset, or eviction by newer keys).
        """
        with self._lock:
            return idempotency_key in self._memory

    def settle(
        self,
        ticket: Ticket,
        idempotency_key: str | None,
        fingerprint: str,
        input_digests: Sequence[str],
        tokens: int,
        body: bytes,
        *,
        dedupe: bool,
        lost: bool,
        charge_keys: Sequence[str] = (),
    ) -> Settled | None:
        """Charge a request that did its work, or replay what its key remembers.

        Return the body to answer with and whether it is a replay: ``body`` when the request
        is charged (``tokens`` being its usage tokens, ``input_digests`` those of the inputs
        it embedded, none for a chat request), the first response's body when it is
        replayed, or None when the key was charged for a request with another fingerprint
        (the caller answers 422 and counts it with :meth:`fail`). With ``dedupe`` off every
        request is charged. ``lost`` counts the response as dropped. ``charge_keys`` are the
        ``embedding_charges`` keys of the inputs a charge buys. A request begun before
        a reset is neither counted nor remembered.
        """
        with self._lock:
            if ticket.generation != self._generation:
                return Settled(body, replayed=False)
            remembered = self._memory.get(idempotency_key) if idempotency_key else None
            replayed = False
            if dedupe and remembered is not None:
                if remembered.fingerprint != fingerprint:
                    return None
                self._deduplicated += 1
                body = remembered.body
                replayed = True
            else:
                self._charged += 1
                if ticket.endpoint == CHAT:
                    self._chat_charged += 1
                self._inputs_embedded += len(input_digests)
                self._tokens_charged += tokens
                for digest in input_digests:
                    self._input_success_counts[digest] = (
                        self._input_success_counts.get(digest, 0) + 1
                    )
                _count(self._embedding_charges, charge_keys)
                if lost:
                    _count(self._lost_embedding_charges, charge_keys)
                if idempotency_key is not None:
                    count = self._idempotency_keys.get(idempotency_key, 0)
                    self._idempotency_keys[idempotency_key] = count + 1
                    if remembered is None:
                        self._memory.remember(idempotency_key, Remembered(fingerprint, body))
                    else:
                        self._would_deduplicate += 1
            self._succeeded += 1
            self._count_status(200)
            if lost:
                self._lost_responses += 1
            return Settled(body, replayed)

    def end(self, ticket: Ticket) -> None:
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

    def store_webhook(self, name: str, key: str, event: object, status: int) -> WebhookReply:
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
            reply = self._webhook_replies[(name, key)] = WebhookReply(status, payload)
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

    def count_upload(self, *, lost: bool) -> None:
        """Count a stored upload, and whether its response is lost."""
        with self._lock:
            self._files_uploaded += 1
            if lost:
                self._upload_responses_lost += 1

    def count_file_stored(self) -> None:
        """Count a file stored (an upload or a batch's result file)."""
        with self._lock:
            self._files_stored += 1

    def count_file_deleted(self) -> None:
        """Count a stored file deleted."""
        with self._lock:
            self._files_stored -= 1

    def count_batch_created(self) -> None:
        """Count a batch created."""
        with self._lock:
            self._batches_created += 1

    def charge_batch_lines(
        self, lines: Sequence[tuple[str, int, int]], charge_keys: Sequence[str] = (), lost: int = 0
    ) -> None:
        """Charge a batch's output lines: ``(custom_id, inputs, tokens)`` for each, and the
        ``embedding_charges`` keys of all their inputs; ``lost`` of them are in no file."""
        with self._lock:
            self._batch_lines_lost += lost
            _count(self._embedding_charges, charge_keys)
            for custom_id, inputs, tokens in lines:
                self._batch_lines_charged += 1
                self._batch_inputs_charged += inputs
                self._batch_tokens_charged += tokens
                self._batch_line_charges[custom_id] = self._batch_line_charges.get(custom_id, 0) + 1

    def reset(self) -> None:
        """Zero every counter except the live ``in_flight`` gauge and forget all memory."""
        with self._lock:
            self._generation += 1
            self._zero()

    def arrivals(self) -> list[float]:
        """When each of the last ``ARRIVALS_KEPT`` requests arrived (monotonic seconds)."""
        with self._lock:
            return list(self._arrivals)

    def snapshot(self) -> dict[str, Any]:
        """Return the counters as the JSON object ``GET /stats`` shows."""
        with self._lock:
            return {
                "requests": self._requests,
                "by_endpoint": dict(self._by_endpoint),
                "succeeded": self._succeeded,
                "charged": self._charged,
                "chat_charged": self._chat_charged,
                "deduplicated": self._deduplicated,
                "would_deduplicate": self._would_deduplicate,
                "failed": self._failed,
                "lost_responses": self._lost_responses,
                "rejected_concurrency": self._rejected_concurrency,
                "rejected_tpm": self._rejected_tpm,
                "by_status": dict(self._by_status),
                "inputs_embedded": self._inputs_embedded,
                "tokens_charged": self._tokens_charged,
                "input_success_counts": dict(self._input_success_counts),
                "embedding_charges": dict(self._embedding_charges),
                "lost_embedding_charges": dict(self._lost_embedding_charges),
                "idempotency_keys": dict(self._idempotency_keys),
                "in_flight": self._in_flight,
                "peak_in_flight": self._peak_in_flight,
                "webhooks": dict(self._webhooks),
                "files_uploaded": self._files_uploaded,
                "upload_responses_lost": self._upload_responses_lost,
                "files_stored": self._files_stored,
                "batches_created": self._batches_created,
                "batch_lines_charged": self._batch_lines_charged,
                "batch_inputs_charged": self._batch_inputs_charged,
                "batch_tokens_charged": self._batch_tokens_charged,
                "batch_line_charges": dict(self._batch_line_charges),
                "batch_lines_lost": self._batch_lines_lost,
            }


def _count(counts: dict[str, int], keys: Sequence[str]) -> None:
    for key in keys:
        counts[key] = counts.get(key, 0) + 1


def charge_key(model: str, dim: int, text: str) -> str:
    """The ``embedding_charges`` key of one input embedded by ``model`` at ``dim``."""
    return f"{model}/{dim}/{hashlib.sha256(text.encode()).hexdigest()}"
