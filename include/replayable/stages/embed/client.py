"""Embed chunk texts through an OpenAI-compatible ``/v1/embeddings`` endpoint.

The provider is a small Protocol; :class:`HttpEmbeddingClient` implements it over httpx.
Which endpoint and key are used is decided in one place, ``replayable.stages.embed.endpoint``.
Every HTTP request is reported to ``on_call`` so that billable calls are counted.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from replayable.retry import CallRetry, ErrorKind, ItemError, call_with_retries, classify

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


Gate = Callable[[], AbstractContextManager[Any]]


@dataclass(frozen=True)
class EmbeddingResult:
    """Vectors in input order, and the tokens the provider billed."""

    vectors: list[list[float]]
    tokens: int


@dataclass(frozen=True)
class CallRecord:
    """One HTTP request to the provider, successful or not."""

    idempotency_key: str
    attempt: int
    status: str  # "ok" or the error class
    http_status: int | None
    latency_ms: int
    n_inputs: int
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


class HttpEmbeddingClient:
    """OpenAI-compatible embeddings over httpx, with classified, bounded retries.

    :param base_url: the API root including ``/v1``, e.g. ``http://127.0.0.1:8765/v1``.
    :param model: the model name sent with each request.
    :param api_key: sent as a bearer token; never logged or stored.
    :param dimensions: optional output size, for models that accept it.
    :param timeout_s: the whole request's deadline, from sending to the last byte; a
        server that trickles its answer is cut off at it.
    :param retry: bounds for retrying one call.
    :param max_connections: HTTP connections kept open (requests in flight at once).
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        dimensions: int | None = None,
        timeout_s: float = 30.0,
        retry: CallRetry | None = None,
        max_connections: int = 16,
    ) -> None:
        self.model = model
        self.dimensions = dimensions
        self.retry = retry or CallRetry()
        self.timeout_s = timeout_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
        )

    def close(self) -> None:
        self._http.close()

    def embed(
        self,
        texts: Sequence[str],
        *,
        idempotency_key: str,
        on_call: Callable[[CallRecord], None] | None = None,
        gate: Gate | None = None,
    ) -> EmbeddingResult:
        """Embed ``texts`` in one request, retried per :class:`CallRetry`."""
        attempt = 0

        def once() -> EmbeddingResult:
            nonlocal attempt
            attempt += 1
            with gate() if gate is not None else contextlib.nullcontext():
                return self._request(texts, idempotency_key, attempt, on_call)

        return call_with_retries(once, self.retry, describe=f"embed {idempotency_key}")

    def _request(
        self,
        texts: Sequence[str],
        key: str,
        attempt: int,
        on_call: Callable[[CallRecord], None] | None,
    ) -> EmbeddingResult:
        body: dict[str, object] = {"model": self.model, "input": list(texts)}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        started = time.monotonic()
        http_status: int | None = None
        status, tokens = "interrupted", 0
        limit = response_limit(len(texts), self.dimensions)
        try:
            with self._http.stream(
                "POST", "/embeddings", json=body, headers={"Idempotency-Key": key}
            ) as response:
                http_status = response.status_code
                content = _read_within(response, started + self.timeout_s, limit)
            response.raise_for_status()
            result = _parse(_json(content), len(texts))
            status, tokens = "ok", result.tokens
        except Exception as exc:
            status, tokens = classify(exc).error_class, 0
            raise
        finally:
            if on_call is not None:
                latency_ms = int((time.monotonic() - started) * 1000)
                on_call(
                    CallRecord(key, attempt, status, http_status, latency_ms, len(texts), tokens)
                )
        return result


def _read_within(response: httpx.Response, deadline: float, limit: int) -> bytes:
    """Read the body by a total deadline and a size cap (httpx's timeouts are per phase)."""
    parts: list[bytes] = []
    size = 0
    for part in response.iter_bytes():
        size += len(part)
        if size > limit:
            raise ItemError(
                "bad_response",
                f"the response is larger than {limit} bytes; refused",
                ErrorKind.RETRYABLE,
            )
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("the response did not finish within the request's deadline")
        parts.append(part)
    return b"".join(parts)


def _json(content: bytes) -> object:
    try:
        return json.loads(content)
    except ValueError as exc:
        raise ItemError(
            "bad_response", f"the response is not JSON: {exc}", ErrorKind.RETRYABLE
        ) from exc


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
