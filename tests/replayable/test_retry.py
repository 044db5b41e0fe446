import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

from replayable.retry import (
    CallRetry,
    ErrorKind,
    ItemError,
    call_with_retries,
    classify,
    classify_status,
    full_jitter,
    parse_retry_after,
)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_transient_statuses_are_retryable(status):
    assert classify_status(status) == (f"http_{status}", ErrorKind.RETRYABLE)


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_other_client_errors_are_terminal(status):
    assert classify_status(status)[1] is ErrorKind.TERMINAL


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors_are_systemic(status):
    assert classify_status(status)[1] is ErrorKind.SYSTEMIC


def _status_error(status: int, headers: dict[str, str] | None = None) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/v1/embeddings")
    response = httpx.Response(status, headers=headers, request=request)
    return httpx.HTTPStatusError("boom", request=request, response=response)


def test_classify_reads_retry_after_from_the_response():
    error = classify(_status_error(429, {"Retry-After": "7"}))
    assert (error.error_class, error.kind, error.retry_after_s) == ("http_429", "retryable", 7.0)


def test_transport_errors_are_retryable_with_named_classes():
    request = httpx.Request("POST", "http://127.0.0.1/")
    assert classify(httpx.ConnectError("no", request=request)).error_class == "connect_error"
    assert classify(httpx.ReadTimeout("slow", request=request)).error_class == "read_timeout"
    assert classify(httpx.RemoteProtocolError("reset", request=request)).error_class == (
        "connection_reset"
    )


def test_unknown_exceptions_are_retryable_and_named_unexpected():
    error = classify(KeyError("x"))
    assert (error.error_class, error.kind) == ("unexpected", ErrorKind.RETRYABLE)


def test_item_error_survives_pickling_with_all_fields():
    import pickle

    blob = pickle.dumps(ItemError("encrypted", "locked", ErrorKind.TERMINAL, 3.0))
    error = pickle.loads(blob)  # noqa: S301 - bytes made on the line above
    assert (error.error_class, str(error), error.kind, error.retry_after_s) == (
        "encrypted",
        "locked",
        ErrorKind.TERMINAL,
        3.0,
    )


def test_retry_after_parses_seconds_and_http_dates():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("12") == 12.0
    assert (
        parse_retry_after(format_datetime(now + timedelta(seconds=30), usegmt=True), now=now) == 30
    )
    assert (
        parse_retry_after(format_datetime(now - timedelta(seconds=30), usegmt=True), now=now) == 0
    )
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


def test_full_jitter_draws_within_the_capped_window():
    rng = random.Random(1)
    draws = [
        full_jitter(attempt, base_s=1.0, cap_s=10.0, rng=rng)
        for attempt in range(8)
        for _ in range(50)
    ]
    assert all(0 <= d <= 10.0 for d in draws)
    assert max(full_jitter(0, base_s=1.0, cap_s=10.0, rng=rng) for _ in range(100)) <= 1.0
    # The window grows: late attempts reach well past the first window.
    assert max(draws[-50:]) > 2.0


def test_call_retries_retryable_errors_and_honours_retry_after():
    waits: list[float] = []
    calls = iter([_status_error(503), _status_error(429, {"Retry-After": "3"}), "ok"])

    def fn():
        value = next(calls)
        if isinstance(value, Exception):
            raise value
        return value

    assert (
        call_with_retries(
            fn, CallRetry(max_attempts=5, base_s=0.5, cap_s=2), describe="t", sleep=waits.append
        )
        == "ok"
    )
    assert len(waits) == 2
    assert 0 <= waits[0] <= 0.5
    assert waits[1] == 3.0


def test_call_does_not_retry_terminal_errors():
    waits: list[float] = []
    count = 0

    def fn():
        nonlocal count
        count += 1
        raise _status_error(400)

    with pytest.raises(httpx.HTTPStatusError):
        call_with_retries(fn, CallRetry(), describe="t", sleep=waits.append)
    assert (count, waits) == (1, [])


def test_call_gives_up_after_max_attempts():
    count = 0

    def fn():
        nonlocal count
        count += 1
        raise _status_error(503)

    with pytest.raises(httpx.HTTPStatusError):
        call_with_retries(fn, CallRetry(max_attempts=3), describe="t", sleep=lambda s: None)
    assert count == 3


def test_call_leaves_a_long_retry_after_to_the_task_retry():
    count = 0

    def fn():
        nonlocal count
        count += 1
        raise _status_error(429, {"Retry-After": "3600"})

    with pytest.raises(httpx.HTTPStatusError):
        call_with_retries(fn, CallRetry(max_total_s=60), describe="t", sleep=lambda s: None)
    assert count == 1
