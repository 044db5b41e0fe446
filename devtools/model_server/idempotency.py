"""The idempotency memory: successful response bodies by ``Idempotency-Key``.

A successful ``/v1/embeddings`` or ``/v1/chat/completions`` response is remembered under
its ``Idempotency-Key`` header together with a fingerprint of the request: its endpoint
and what it asks (embeddings: model, inputs, dimensions, encoding; chat: model, messages,
``max_tokens``, temperature). A later request with the same key and the same fingerprint
gets the remembered body again and is counted as ``deduplicated``, not charged; with a
different fingerprint it gets 422 ``idempotency_key_reused``. The keys of both endpoints
share one memory, since a key names one request, whatever its endpoint: a key
used for embeddings and then for a chat completion gets 422 there, never the embeddings
answer. Failed requests are not remembered, so their retry is served and charged
normally. Requests with one key that are in flight at the same time are neither blocked
nor refused: the charge is taken atomically when a request has done its work (embedded
its inputs, written its answer), so the first to get there is charged and every other
one is answered with the first one's body, exactly as if it had waited for it. (A 409
would be terminal to a client that treats other 4xx as final, and waiting would tie a
retry to a first attempt held by a hang fault.) The memory keeps the most recently used
:data:`IDEMPOTENCY_MAX_KEYS` keys and at most :data:`IDEMPOTENCY_MAX_BYTES` of bodies; a
key evicted from it, or whose body alone is larger than that, is charged again.
``POST /stats/reset`` forgets every key.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

IDEMPOTENCY_MAX_KEYS = 100_000
IDEMPOTENCY_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Remembered:
    """A charged response: what its request asked (a fingerprint) and the body it got."""

    fingerprint: str
    body: bytes


class IdempotencyMemory:
    """Successful response bodies by ``Idempotency-Key``; the least recently used go first.

    Bounded by a number of keys and by bytes (keys, fingerprints and bodies); a body larger
    than the byte bound on its own is not remembered. Not thread-safe by itself: the
    :class:`~devtools.model_server.stats.Stats` lock guards it.
    """

    def __init__(self, max_keys: int, max_bytes: int) -> None:
        if max_keys < 1 or max_bytes < 1:
            raise ValueError(f"idempotency memory bounds must be >= 1, got {max_keys}, {max_bytes}")
        self._max_keys = max_keys
        self._max_bytes = max_bytes
        self._entries: OrderedDict[str, Remembered] = OrderedDict()
        self._bytes = 0

    @staticmethod
    def _size(key: str, entry: Remembered) -> int:
        return len(key) + len(entry.fingerprint) + len(entry.body)

    def get(self, key: str) -> Remembered | None:
        """Return what ``key`` remembers, marking it most recently used; None if nothing."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def __contains__(self, key: str) -> bool:
        """Whether ``key`` is remembered; unlike :meth:`get`, its recency stays as it was."""
        return key in self._entries

    def remember(self, key: str, entry: Remembered) -> None:
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


class Fingerprinted(Protocol):
    """A checked request of either endpoint."""

    def canonical(self) -> list[object]:
        """Its endpoint and what it asks, as JSON-ready values."""
        ...


def fingerprint(request: Fingerprinted) -> str:
    """Return what identifies a request for its idempotency key: what it asks, not its bytes.

    The canonical form starts with the endpoint, so requests to different endpoints never
    share a fingerprint.
    """
    canonical = json.dumps(request.canonical(), separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
