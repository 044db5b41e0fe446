"""RequestBudget's rate limit: send times reserved in Postgres, one statement each."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import pytest

from replayable import db
from replayable.budget import RequestBudget

pytestmark = pytest.mark.db


def budget(dsn: str, name: str, rps: float, burst: int = 1) -> RequestBudget:
    return RequestBudget(name, 4, max_rps=rps, burst=burst, connect=lambda: db.Database(dsn))


def send_times(
    *reservations: Callable[[], float],
) -> tuple[list[float], list[tuple[float, float]]]:
    """Make each reservation in turn; return the waits, and when each send time is on this
    process's monotonic clock, as the window it lies in: its wait added to the moment before
    it was asked for and to the moment after it answered (Postgres read its own clock in
    between). However long a loaded machine takes between two reservations, the windows hold.
    """
    waits, windows = [], []
    for reserve in reservations:
        asked = time.monotonic()
        wait = reserve()
        waits.append(wait)
        windows.append((asked + wait, time.monotonic() + wait))
    return waits, windows


def after_first(
    waits: list[float], windows: list[tuple[float, float]], expected: list[float]
) -> bool:
    """Whether send time k can be ``expected[k]`` seconds after the first, for every k (to a
    millisecond, Postgres's intervals and the float seconds they are sent as): exactly when
    it waited, its time reserved behind the others'; and no sooner when it went at once,
    asked for that late or within a burst."""
    (first_low, first_high), slack = windows[0], 1e-3
    return all(
        low - first_high - slack <= seconds <= high - first_low + slack
        if wait > 0
        else seconds <= high - first_low + slack
        for wait, (low, high), seconds in zip(waits, windows, expected, strict=True)
    )


def test_send_times_follow_each_other_at_the_rate_across_workers(conn, dsn):
    """Two budgets of one name (two workers) reserve interleaved times 1/max_rps apart."""
    first, second = budget(dsn, "provider-a", rps=2), budget(dsn, "provider-a", rps=2)
    try:
        waits, windows = send_times(*[(first if i % 2 else second).reserve for i in range(6)])
    finally:
        first.close()
        second.close()
    assert waits[0] == 0
    # 0.5 s apart, on Postgres's clock, however long each reservation took to make.
    for (_, wait), pair in zip(itertools.pairwise(waits), itertools.pairwise(windows), strict=True):
        assert after_first([0.0, wait], list(pair), [0.0, 0.5]), (waits, windows)


def test_a_burst_goes_back_to_back_then_the_rate_applies(conn, dsn):
    # Two seconds apart: only a stall that long between reservations could move the fourth.
    rate = budget(dsn, "provider-b", rps=0.5, burst=3)
    try:
        waits, windows = send_times(*[rate.reserve] * 5)
    finally:
        rate.close()
    assert waits[:3] == [0, 0, 0]
    assert after_first(waits, windows, [0.0, 0.0, 0.0, 2.0, 4.0]), (waits, windows)


def test_budgets_of_other_providers_do_not_wait_for_each_other(conn, dsn):
    busy, other = budget(dsn, "provider-c", rps=1), budget(dsn, "provider-d", rps=1)
    try:
        assert after_first(*send_times(*[busy.reserve] * 3), [0.0, 1.0, 2.0])
        assert other.reserve() == 0
    finally:
        busy.close()
        other.close()


def test_without_max_rps_nothing_is_reserved(conn):
    assert RequestBudget("provider-e", 2).reserve() == 0
    with pytest.raises(ValueError, match="connect"):
        RequestBudget("provider-e", 2, max_rps=5)
    with pytest.raises(ValueError, match="max_rps"):
        RequestBudget("provider-e", 2, max_rps=0, connect=lambda: db.Database(""))


def token_budget(dsn: str, name: str, tpm: float) -> RequestBudget:
    return RequestBudget(name, 4, max_tpm=tpm, connect=lambda: db.Database(dsn))


def test_tokens_are_paid_after_the_send_and_the_next_request_waits_for_them(conn, dsn):
    """At 60 tokens a minute (one a second), across two workers: a request goes at once,
    and the next waits for its tokens less the second of tolerance."""
    first, second = token_budget(dsn, "provider-t", 60), token_budget(dsn, "provider-t", 60)
    try:
        waits, windows = send_times(
            lambda: first.reserve(10), lambda: second.reserve(5), lambda: first.reserve(1)
        )
    finally:
        first.close()
        second.close()
    assert waits[0] == 0
    # At once; then 10 tokens owed, 1 s of them tolerated; then 15 owed.
    assert after_first(waits, windows, [0.0, 9.0, 14.0]), (waits, windows)


def test_a_refund_gives_back_what_the_provider_did_not_count(conn, dsn):
    """Reserved on an estimate, corrected from usage: unused tokens shorten the next wait,
    and tokens past the estimate lengthen it."""
    rate = token_budget(dsn, "provider-u", 60)

    def refunded(reserved: int, used: int) -> float:
        rate.refund(reserved=reserved, used=used)
        return rate.reserve(1)

    try:
        waits, windows = send_times(
            lambda: rate.reserve(30),
            lambda: refunded(30, 12),  # 18 given back
            lambda: refunded(1, 21),  # 20 more charged
        )
    finally:
        rate.close()
    assert after_first(waits, windows, [0.0, 11.0, 32.0]), (waits, windows)


def test_the_request_rate_and_the_token_rate_both_hold(conn, dsn):
    """With max_rps and max_tpm, a request waits for the later of the two."""
    both = RequestBudget("provider-v", 4, max_rps=1, max_tpm=600, connect=lambda: db.Database(dsn))
    try:
        waits, windows = send_times(
            *[lambda tokens=tokens: both.reserve(tokens) for tokens in (1, 1, 200, 1)]
        )
    finally:
        both.close()
    assert waits[0] == 0
    # The request rate binds the second and third; then 202 tokens are owed at 10 a second,
    # 1 s of them tolerated.
    assert after_first(waits, windows, [0.0, 1.0, 2.0, 19.2]), (waits, windows)


def test_max_tpm_must_be_positive_and_needs_a_database():
    with pytest.raises(ValueError, match="max_tpm"):
        RequestBudget("p", 1, max_tpm=0, connect=lambda: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="max_tpm"):
        RequestBudget("p", 1, max_tpm=100)
