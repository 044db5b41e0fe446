"""Embed chunk texts through an OpenAI-compatible ``/v1/embeddings`` endpoint.

The provider is a small Protocol; :class:`HttpEmbeddingClient` implements it over httpx.
Which endpoint and key are used is decided in one place, ``replayable.models.endpoint``.
Every HTTP request is reported to ``on_call`` so that billable calls are counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from replayable.models.http import CallRecord, Gate, HttpModelClient, Request
from replayable.retry import ErrorKind, ItemError

__all__ = ["CallRecord", "EmbeddingProvider", "EmbeddingResult", "Gate", "HttpEmbeddingClient"]

# A response is refused past a size that every legitimate answer fits (ADR 0078): a float
# prints in at most 24 characters ("-2.2250738585072014e-308"), and providers that indent
# their JSON (OpenAI: eight spaces, a comma and a newline per component) add about 10
# more; 40 bytes a component leaves room for deeper indentation. The dimensions are the
# ones asked for or, when the provider picks them, pgvector's limit: no longer vector can
# be stored, so nothing legitimate is larger.
_BYTES_PER_COMPONENT = 40
_BYTES_PER_ENTRY = 1024  # "object", "index" and the brackets around each vector
_PGVECTOR_MAX_DIMENSIONS = 16_000
_RESPONSE_OVERHEAD = 64 * 1024


def response_limit(n_inputs: int, dimensions: int | None) -> int:
    """Return the most bytes a legitimate answer for ``n_inputs`` vectors can take."""
    per_input = _BYTES_PER_ENTRY + _BYTES_PER_COMPONENT * (dimensions or _PGVECTOR_MAX_DIMENSIONS)
    return _RESPONSE_OVERHEAD + n_inputs * per_input


@dataclass(frozen=True)
class EmbeddingResult:
    """Vectors in input order, and the tokens the provider billed."""

    vectors: list[list[float]]
    tokens: int


class EmbeddingProvider(Protocol):
    """Anything that turns texts into vectors."""

    def embed(
        self,
        texts: Sequence[str],
        *,
        idempotency_key: str,
        on_call: Callable[[CallRecord], None] | None = None,
        gate: Gate | None = None,
    ) -> EmbeddingResult:
        """Embed ``texts``; ``idempotency_key`` names the request so a provider can de-duplicate.

        ``on_call`` receives a CallRecord for every request made, failed ones included;
        ``gate`` is entered around each HTTP request (a shared in-flight budget).
        """
        ...


class HttpEmbeddingClient(HttpModelClient):
    """OpenAI-compatible embeddings over httpx, with classified, bounded retries.

    ``dimensions``: optional output size, for models that accept it; the other parameters
    are :class:`~replayable.models.http.HttpModelClient`'s (as keywords).
    """

    def __init__(self, *, dimensions: int | None = None, **client: Any) -> None:
        super().__init__(**client)
        self.dimensions = dimensions

    def embed(
        self,
        texts: Sequence[str],
        *,
        idempotency_key: str,
        on_call: Callable[[CallRecord], None] | None = None,
        gate: Gate | None = None,
    ) -> EmbeddingResult:
        """Embed ``texts`` in one request, retried per :class:`CallRetry`."""
        return self._send(self._request(texts), idempotency_key, on_call, gate, what="embed")

    def _request(self, texts: Sequence[str]) -> Request[EmbeddingResult]:
        body: dict[str, object] = {"model": self.model, "input": list(texts)}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        return Request(
            "/embeddings",
            body,
            response_limit(len(texts), self.dimensions),
            len(texts),
            lambda payload: _parse(payload, len(texts)),
            lambda result: result.tokens,
        )


def _parse(payload: object, expected: int) -> EmbeddingResult:
    """Validate an embeddings response: one vector of finite numbers per input, in index order.

    Every failure is ``bad_response``, retryable: the provider's fault, not the input's
    (ADR 0078). A vector with NaN or infinity (JSON ``NaN``, ``Infinity``, a ``"nan"``
    string, or a literal past the float range) is refused here, because pgvector refuses it
    at the insert, after the call was paid, as an error no class describes.
    """
    try:
        assert isinstance(payload, dict)
        data = sorted(payload["data"], key=lambda row: row["index"])
        vectors = [[float(x) for x in row["embedding"]] for row in data]
        usage = payload.get("usage") or {}
        tokens = int(usage.get("total_tokens") or usage.get("prompt_tokens") or 0)
    except (AssertionError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ItemError(
            "bad_response", f"unreadable embeddings response: {exc!r}", ErrorKind.RETRYABLE
        ) from exc
    if len(vectors) != expected:
        raise ItemError(
            "bad_response", f"asked for {expected} vectors, got {len(vectors)}", ErrorKind.RETRYABLE
        )
    for number, vector in enumerate(vectors):
        if not all(map(math.isfinite, vector)):
            at = next(i for i, x in enumerate(vector) if not math.isfinite(x))
            raise ItemError(
                "bad_response",
                f"vector {number} is not finite: component {at} is {vector[at]}",
                ErrorKind.RETRYABLE,
            )
    return EmbeddingResult(vectors=vectors, tokens=tokens)
