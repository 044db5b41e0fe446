"""The overview's chart: dead letters created in each of the last 48 hours, each bar a link."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from ui_fixtures import (  # noqa: F401 - fixtures
    A,
    _hrefs,
    app_fixture,
    auth_manager_fixture,
    client_fixture,
    ledger_fixture,
)


def test_the_chart_counts_the_letters_created_in_each_of_the_last_48_hours(
    client: TestClient, conn: Any, ledger: dict[str, int]
) -> None:
    with conn.cursor() as cur:
        # Two hours ago (twice), 47.5 hours ago (the window's first hour, or just before it),
        # and three days ago (outside the window): the test buckets them itself below.
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, status, created_at)"
            " SELECT 'chunk', 'h' || n, %s, 'timeout', 'retryable', 'slow', 3, '1', 'ignored',"
            " now() - make_interval(mins => m)"
            " FROM unnest(ARRAY[1, 2, 3, 4], ARRAY[120, 121, 2850, 4320]) AS t (n, m)",
            (A,),
        )
        cur.execute("SELECT created_at, now() FROM replayable.dead_letters")
        found = cur.fetchall()
    conn.commit()
    now = found[0][1].astimezone(UTC)
    first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=47)
    expected = [0] * 48
    for created, _ in found:
        index = int((created.astimezone(UTC) - first).total_seconds() // 3600)
        if 0 <= index < 48:
            expected[index] += 1

    chart = client.get("/replayable/api/dead-letters/per-hour").json()
    assert [h["created"] for h in chart["per_hour"]] == expected
    assert chart["total"] == sum(expected) and chart["peak"] == max(expected)
    hours = [datetime.fromisoformat(h["hour"]) for h in chart["per_hour"]]
    assert hours[0] == first and hours[-1] == first + timedelta(hours=47)

    page = client.get("/replayable/").text
    assert "<script" not in page
    assert page.count('class="bar"') == sum(1 for n in expected if n)
    assert page.count('class="zero"') == sum(1 for n in expected if not n)
    table = re.search(r'<table class="per-hour">(.*?)</table>', page, re.S)
    assert table is not None
    cells = re.findall(r'<td class="num">(\d+)</td>', table.group(1))
    assert [int(c) for c in cells] == expected


def test_a_bar_lists_the_letters_of_its_hour(client: TestClient, ledger: dict[str, int]) -> None:
    page = client.get("/replayable/")
    bars = [h for h in _hrefs(page) if h.startswith("/replayable/dead-letters?status=all")]
    assert bars
    for bar in bars:
        listed = client.get(bar.replace("/dead-letters", "/api/dead-letters")).json()
        assert listed["matched"] >= 1
