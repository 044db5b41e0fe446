"""What every model client shares: its call records, the budget gate, reading an answer.

A model call is one HTTP request to an OpenAI-compatible endpoint; each one, failed ones
included, is reported as a :class:`CallRecord` so that billable calls are counted, and each
is sent inside a ``Gate`` (the shared in-flight, rate and token budget). An answer is read
by a total deadline and a size cap (:func:`read_within`) and parsed as JSON
(:func:`parse_json`); what it must contain is each client's own business.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from replayable.retry import CallRetry, ErrorKind, ItemError, call_with_retries, classify

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Price:
    """What a model's tokens cost, in USD per million: ``input`` (the prompt) and ``output``
    (the completion), and the same through the Batch API, as the model connection's extra
    ``prices`` states them (ADR 0110, 0117)."""

    input: float
    output: float = 0.0
    # Through the provider's Batch API (ADR 0117); None: half the synchronous price, the
    # discount OpenAI-compatible providers publish for it.
    batch_input: float | None = None
    batch_output: float | None = None

    def of(self, input_tokens: int, output_tokens: int, mode: str = "sync") -> float:
        if mode == "batch":
            rate_in = self.input / 2 if self.batch_input is None else self.batch_input
            rate_out = self.output / 2 if self.batch_output is None else self.batch_output
        else:
            rate_in, rate_out = self.input, self.output
        return (input_tokens * rate_in + output_tokens * rate_out) / 1_000_000


@dataclass(frozen=True)
class CallRecord:
    """One HTTP request to the provider, successful or not.

    ``tokens`` are all the tokens the provider counted, ``output_tokens`` those of them it
    generated; ``cost_usd`` is None when the model has no price (or the call no answer).
    """

    idempotency_key: str
    attempt: int
    status: str  # "ok" or the error class
    http_status: int | None
    latency_ms: int
    n_inputs: int
    tokens: int
    model: str = ""
    output_tokens: int = 0
    cost_usd: float | None = None
    mode: str = "sync"  # or "batch": a line of a Batch API job (ADR 0117)


Gate = Callable[[], AbstractContextManager[Any]]


class HttpModelClient:
    """An OpenAI-compatible endpoint over httpx: the connection and the retried, gated call.

    :param base_url: the API root including ``/v1``, e.g. ``http://127.0.0.1:8765/v1``.
    :param model: the model name sent with each request.
    :param api_key: sent as a bearer token; never logged or stored.
    :param timeout_s: the whole request's deadline, from sending to the last byte; a
        server that trickles its answer is cut off at it.
    :param retry: bounds for retrying one call.
    :param max_connections: HTTP connections kept open (requests in flight at once).
    :param price: the model's price, which each answered call is costed at; None: unpriced.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 30.0,
        retry: CallRetry | None = None,
        max_connections: int = 16,
        price: Price | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.price = price
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

    def _call(self, send: Callable[[int], T], *, gate: Gate | None, describe: str) -> T:
        """``send(attempt)`` inside ``gate``, retried per :class:`CallRetry`."""
        attempt = 0

        def once() -> T:
            nonlocal attempt
            attempt += 1
            with gate() if gate is not None else contextlib.nullcontext():
                return send(attempt)

        return call_with_retries(once, self.retry, describe=describe)

    def _send(
        self,
        request: Request[R],
        key: str,
        on_call: Callable[[CallRecord], None] | None,
        gate: Gate | None,
        *,
        what: str,
    ) -> R:
        """``request`` under the Idempotency-Key ``key``, inside ``gate``, retried per
        :class:`CallRetry` (logged as ``what`` and the key); each try reported to ``on_call``."""
        return self._call(
            lambda attempt: self._post(request, key, attempt, on_call),
            gate=gate,
            describe=f"{what} {key}",
        )

    def _post(
        self,
        call: Request[R],
        key: str,
        attempt: int,
        on_call: Callable[[CallRecord], None] | None,
    ) -> R:
        """Send one request under the Idempotency-Key ``key``; report it to ``on_call``.

        The answer is read by the request's deadline and within ``call.limit`` bytes, then
        parsed by ``call.parse``; a failure is reported with its error class, then raised.
        """
        started = time.monotonic()
        http_status: int | None = None
        status, tokens, output_tokens = "interrupted", 0, 0
        answered = False
        try:
            with self._http.stream(
                "POST", call.path, json=call.body, headers={"Idempotency-Key": key}
            ) as response:
                http_status = response.status_code
                content = read_within(response, started + self.timeout_s, call.limit)
            response.raise_for_status()
            payload = parse_json(content)
            # What the provider billed, read before the answer is judged: a refusal or an
            # empty answer comes back 2xx with its usage, and is charged like any other.
            usage = usage_of(payload)
            if usage is not None:
                tokens, output_tokens = usage
            result = call.parse(payload)
            answered = True
            status = call.status(result) if call.status else "ok"
            if usage is None:
                tokens = call.tokens(result)
                output_tokens = call.output_tokens(result) if call.output_tokens else 0
        except Exception as exc:
            status = classify(exc).error_class
            raise
        finally:
            if on_call is not None:
                latency_ms = int((time.monotonic() - started) * 1000)
                cost = None
                # Billed: answered, or answered 2xx with usage and judged unusable (ADR 0114).
                billed = answered or (tokens > 0 and 200 <= (http_status or 0) < 300)
                if billed and self.price is not None:
                    cost = self.price.of(tokens - output_tokens, output_tokens)
                on_call(
                    CallRecord(
                        key,
                        attempt,
                        status,
                        http_status,
                        latency_ms,
                        call.inputs,
                        tokens,
                        model=self.model,
                        output_tokens=output_tokens,
                        cost_usd=cost,
                    )
                )
        return result


@dataclass(frozen=True)
class Request(Generic[R]):
    """One request's path and body, the most bytes its answer may take, and how to read it."""

    path: str
    body: dict[str, object]
    limit: int
    inputs: int
    parse: Callable[[object], R]
    tokens: Callable[[R], int]
    output_tokens: Callable[[R], int] | None = None
    # The status an answer is recorded with when it is not plainly "ok" (a kept truncated
    # chat answer); None: "ok".
    status: Callable[[R], str] | None = None


def usage_of(payload: object) -> tuple[int, int] | None:
    """The tokens an OpenAI-shaped answer says it billed, all and generated (completion);
    None when it carries no readable ``usage``."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    try:
        output = int(usage.get("completion_tokens") or 0)
        total = int(usage.get("total_tokens") or 0) or int(usage.get("prompt_tokens") or 0) + output
    except (TypeError, ValueError):
        return None
    if total < 0 or output < 0 or output > total:
        return None
    return total, output


def read_within(response: httpx.Response, deadline: float, limit: int) -> bytes:
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


def parse_json(content: bytes) -> object:
    try:
        return json.loads(content)
    except ValueError as exc:
        raise ItemError(
            "bad_response", f"the response is not JSON: {exc}", ErrorKind.RETRYABLE
        ) from exc
