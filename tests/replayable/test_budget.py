"""RequestBudget's rate limit: send times reserved in Postgres, one statement each."""

from __future__ import annotations

import itertools

import pytest

from replayable import db
from replayable.budget import RequestBudget

pytestmark = pytest.mark.db


def budget(dsn: str, name: str, rps: float, burst: int = 1) -> RequestBudget:
    return RequestBudget(name, 4, max_rps=rps, burst=burst, connect=lambda: db.Database(dsn))


def test_send_times_follow_each_other_at_the_rate_across_workers(conn, dsn):
    """Two budgets of one name (two workers) reserve interleaved times 1/max_rps apart."""
    first, second = budget(dsn, "provider-a", rps=2), budget(dsn, "provider-a", rps=2)
    try:
        waits = [(first if i % 2 else second).reserve() for i in range(6)]
    finally:
        first.close()
        second.close()
    assert waits[0] == 0
    steps = [later - earlier for earlier, later in itertools.pairwise(waits)]
    # 0.5 s apart, less the moments that pass between two reservations.
    assert all(0.4 < step <= 0.5 for step in steps), waits


def test_a_burst_goes_back_to_back_then_the_rate_applies(conn, dsn):
    rate = budget(dsn, "provider-b", rps=2, burst=3)
    try:
        waits = [rate.reserve() for _ in range(5)]
    finally:
        rate.close()
    assert waits[:3] == [0, 0, 0]
    assert 0.4 < waits[3] <= 0.5 and 0.9 < waits[4] <= 1.0, waits


def test_budgets_of_other_providers_do_not_wait_for_each_other(conn, dsn):
    busy, other = budget(dsn, "provider-c", rps=1), budget(dsn, "provider-d", rps=1)
    try:
        assert [busy.reserve() for _ in range(3)][-1] > 1.5
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
        waits = [first.reserve(10), second.reserve(5), first.reserve(1)]
    finally:
        first.close()
        second.close()
    assert waits[0] == 0
    assert 8.9 < waits[1] <= 9.0, waits  # 10 tokens owed, 1 s of them tolerated
    assert 13.9 < waits[2] <= 14.0, waits  # 15 owed


def test_a_refund_gives_back_what_the_provider_did_not_count(conn, dsn):
    """Reserved on an estimate, corrected from usage: unused tokens shorten the next wait,
    and tokens past the estimate lengthen it."""
    rate = token_budget(dsn, "provider-u", 60)
    try:
        rate.reserve(30)
        rate.refund(reserved=30, used=12)  # 18 given back
        after_refund = rate.reserve(1)
        rate.refund(reserved=1, used=21)  # 20 more charged
        after_charge = rate.reserve(1)
    finally:
        rate.close()
    assert 10.9 < after_refund <= 11.0, after_refund
    assert 31.9 < after_charge <= 32.0, after_charge


def test_the_request_rate_and_the_token_rate_both_hold(conn, dsn):
    """With max_rps and max_tpm, a request waits for the later of the two."""
    both = RequestBudget("provider-v", 4, max_rps=1, max_tpm=600, connect=lambda: db.Database(dsn))
    try:
        waits = [both.reserve(tokens) for tokens in (1, 1, 200)]
        waits.append(both.reserve(1))
    finally:
        both.close()
    assert waits[0] == 0
    assert 0.9 < waits[1] <= 1.0 and 1.9 < waits[2] <= 2.0, waits  # the request rate binds
    assert 19.1 < waits[3] <= 19.2, waits  # 202 tokens owed at 10 a second, 1 s tolerated


def test_max_tpm_must_be_positive_and_needs_a_database():
    with pytest.raises(ValueError, match="max_tpm"):
        RequestBudget("p", 1, max_tpm=0, connect=lambda: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="max_tpm"):
        RequestBudget("p", 1, max_tpm=100)
