"""How many searches a user makes (``search/rate.py``, ADR 0153): admitted up to a limit per
minute, counted in the ledger per user and day, the refused ones not counted."""

from __future__ import annotations

import getpass

import pytest

from checks import fresh_minute, scalar
from replayable.search.rate import TooManySearches, admit, cli_user

pytestmark = pytest.mark.db


def _searches(conn, user: str) -> int:
    return int(
        scalar(
            conn,
            "SELECT coalesce(sum(searches), 0) FROM replayable.search_counts WHERE username = %s",
            user,
        )
    )


def test_a_user_is_admitted_up_to_the_limit_and_then_told_the_seconds_to_the_next_minute(conn, dsn):
    fresh_minute(conn, 5)
    for _ in range(3):
        admit(dsn, "ada", 3)
    with pytest.raises(TooManySearches) as refused:
        admit(dsn, "ada", 3)
    assert (refused.value.user, refused.value.limit) == ("ada", 3)
    assert 1 <= refused.value.retry_after_s <= 60
    assert "3 searches" in str(refused.value)
    assert "[replayable] searches_per_user_per_minute" in str(refused.value)
    admit(dsn, "grace", 3)  # another user's count is their own
    assert (_searches(conn, "ada"), _searches(conn, "grace")) == (3, 1)


def test_a_new_minute_starts_a_new_count_and_the_rate_keeps_one_row_per_user(conn, dsn):
    fresh_minute(conn, 5)
    for _ in range(2):
        admit(dsn, "ada", 2)
    with conn.cursor() as cur:
        cur.execute("UPDATE replayable.search_rates SET minute = minute - interval '1 minute'")
    conn.commit()
    admit(dsn, "ada", 2)
    assert scalar(conn, "SELECT count(*) FROM replayable.search_rates") == 1
    assert _searches(conn, "ada") == 3


def test_without_a_limit_every_search_is_admitted_and_counted(conn, dsn):
    for _ in range(40):
        admit(dsn, "cli:ada", None)
    assert _searches(conn, "cli:ada") == 40


def test_the_cli_searches_as_the_os_user():
    assert cli_user() == f"cli:{getpass.getuser()}"
