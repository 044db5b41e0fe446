"""Error classes, retry decisions, full-jitter backoff and Retry-After.

Every failure of an item gets a named ``error_class`` and one of three kinds:

- ``retryable``: worth another attempt later (HTTP 408/429/5xx, timeouts, resets, a worker
  that timed out, ran out of memory or crashed);
- ``terminal``: the input itself is bad; retrying cannot help (other 4xx, not a PDF,
  encrypted, malformed, oversize, no text), so the item is dead-lettered at once;
- ``systemic``: not the item's fault (401/403, or the provider failing item after item);
  the batch stops without spending the remaining items' attempts.
"""

from __future__ import annotations

import email.utils
import enum
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import tenacity

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
AUTH_STATUS = frozenset({401, 403})


class ErrorKind(enum.StrEnum):
    """How a failure is treated."""

    RETRYABLE = "retryable"
    TERMINAL = "terminal"
    SYSTEMIC = "systemic"


# Error classes that name a passing condition: an ItemError raised with one of them and no
# kind is retryable, as its author means it (ADR 0133). Any other class without a kind is
# terminal: the input itself will never work.
RETRYABLE_CLASSES = frozenset(
    {
        "rate_limited",
        "throttled",
        "timeout",
        "read_timeout",
        "connect_error",
        "connection_reset",
        "unavailable",
        "overloaded",
        "busy",
        *(f"http_{status}" for status in RETRYABLE_STATUS),
    }
)


def default_kind(error_class: str) -> ErrorKind:
    """The kind of an ``ItemError`` raised without one: see :data:`RETRYABLE_CLASSES`."""
    return ErrorKind.RETRYABLE if error_class in RETRYABLE_CLASSES else ErrorKind.TERMINAL


class ItemError(Exception):
    """A classified failure of one item; stage code raises it with its own ``error_class``.

    Without ``kind``, a class of :data:`RETRYABLE_CLASSES` (``rate_limited``, ``timeout``,
    ``unavailable``, ...) is retryable and any other class terminal.
    """

    def __init__(
        self,
        error_class: str,
        message: str,
        kind: ErrorKind | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.kind = default_kind(error_class) if kind is None else ErrorKind(kind)
        self.retry_after_s = retry_after_s

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses process boundaries (guarded workers), so it must pickle with all fields.
        return (type(self), (self.error_class, str(self), self.kind, self.retry_after_s))


@dataclass(frozen=True)
class Classified:
    """The error class and kind of a failure, plus the wait the provider asked for."""

    error_class: str
    kind: ErrorKind
    message: str
    retry_after_s: float | None = None

    @property
    def retryable(self) -> bool:
        return self.kind is ErrorKind.RETRYABLE


def classify_status(status: int) -> tuple[str, ErrorKind]:
    """Map an HTTP status to an error class and kind."""
    if status in AUTH_STATUS:
        return f"http_{status}", ErrorKind.SYSTEMIC
    if status in RETRYABLE_STATUS:
        return f"http_{status}", ErrorKind.RETRYABLE
    if 400 <= status < 500:
        return f"http_{status}", ErrorKind.TERMINAL
    return f"http_{status}", ErrorKind.RETRYABLE


def classify(exc: BaseException) -> Classified:
    """Classify any exception raised while processing an item."""
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ItemError):
        return Classified(exc.error_class, exc.kind, message, exc.retry_after_s)
    # guards.GuardError carries its class (timeout, memory, crash, oversize) the same way.
    guard_class = getattr(exc, "error_class", None)
    if isinstance(guard_class, str):
        kind = ErrorKind.TERMINAL if guard_class == "oversize" else ErrorKind.RETRYABLE
        return Classified(guard_class, kind, message)
    if isinstance(exc, httpx.HTTPStatusError):
        error_class, kind = classify_status(exc.response.status_code)
        retry_after = parse_retry_after(exc.response.headers.get("retry-after"))
        return Classified(error_class, kind, message, retry_after)
    if isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError):
        return Classified("connect_error", ErrorKind.RETRYABLE, message)
    if isinstance(exc, httpx.TimeoutException):
        return Classified("read_timeout", ErrorKind.RETRYABLE, message)
    if isinstance(exc, httpx.TransportError | ConnectionError):
        return Classified("connection_reset", ErrorKind.RETRYABLE, message)
    if type(exc).__name__ == "DatabaseUnavailableError" or _connection_lost(exc):
        # The database went away for longer than the reconnect budget: no item's fault.
        return Classified("database_unavailable", ErrorKind.SYSTEMIC, message)
    if isinstance(exc, BrokenProcessPool):
        # Guarded workers could not start: the setup is broken, not this item.
        return Classified("worker_pool", ErrorKind.SYSTEMIC, message)
    if isinstance(exc, TimeoutError):
        return Classified("timeout", ErrorKind.RETRYABLE, message)
    if isinstance(exc, MemoryError):
        return Classified("memory", ErrorKind.RETRYABLE, message)
    # A bug or an unforeseen failure: retry it up to the attempt cap, then dead-letter it
    # with the full traceback, so nothing is lost and nothing loops forever.
    return Classified("unexpected", ErrorKind.RETRYABLE, message)


def _connection_lost(exc: BaseException) -> bool:
    try:
        import psycopg2.errors
    except ImportError:  # pragma: no cover - psycopg2 is a dependency
        return False
    return isinstance(exc, psycopg2.InterfaceError) or (
        isinstance(exc, psycopg2.OperationalError)
        and not isinstance(exc, psycopg2.errors.QueryCanceled)
    )


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Parse a Retry-After header (delta seconds or an HTTP date) into seconds from now."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def full_jitter(
    attempt: int, *, base_s: float, cap_s: float, rng: random.Random | None = None
) -> float:
    """Return a uniform draw from 0 to min(cap, base * 2**attempt); ``attempt`` counts from 0."""
    high = min(cap_s, base_s * (2**attempt))
    return (rng or random).uniform(0.0, high)


@dataclass(frozen=True)
class CallRetry:
    """Bounds for retrying one model call: attempts, total time, and the backoff window."""

    max_attempts: int = 4
    max_total_s: float = 60.0
    base_s: float = 0.5
    cap_s: float = 20.0


def call_with_retries(
    fn: Callable[[], T],
    policy: CallRetry,
    *,
    describe: str,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn``, retrying retryable failures with full jitter; Retry-After wins over the draw.

    Gives up (re-raising the last error) after ``policy.max_attempts`` calls, or when the
    next wait would end past ``policy.max_total_s``: a long Retry-After is then left to the
    task-level retry, which takes its delay from the error.
    """
    started = time.monotonic()

    def last_error(state: tenacity.RetryCallState) -> Classified:
        exc = state.outcome.exception() if state.outcome else None
        assert exc is not None  # tenacity only waits, stops or logs after a failure here
        return classify(exc)

    def wait(state: tenacity.RetryCallState) -> float:
        retry_after = last_error(state).retry_after_s
        if retry_after is not None:
            return retry_after
        return full_jitter(state.attempt_number - 1, base_s=policy.base_s, cap_s=policy.cap_s)

    def give_up(state: tenacity.RetryCallState) -> bool:
        if state.attempt_number >= policy.max_attempts:
            return True
        # Only a Retry-After is known in advance; a jitter draw is at most cap_s.
        waiting = last_error(state).retry_after_s or 0.0
        return time.monotonic() - started + waiting > policy.max_total_s

    def log_retry(state: tenacity.RetryCallState) -> None:
        log.warning(
            "retrying %s: attempt %d failed with %s; waiting %.2fs",
            describe,
            state.attempt_number,
            last_error(state).error_class,
            state.upcoming_sleep,
        )

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda exc: classify(exc).retryable),
        stop=give_up,
        wait=wait,
        sleep=sleep,
        before_sleep=log_retry,
        reraise=True,
    )
    return retrying(fn)
