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
