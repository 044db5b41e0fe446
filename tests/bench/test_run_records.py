"""bench/run_records.py: a run's time split by where it went, from its task instances and
the ledger's claims and commits."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from run_records import LedgerSpan, TaskRecord, breakdown, describe  # the bench folder, above

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_runs_time_splits_into_its_start_its_gaps_and_its_end():
    tasks = [
        TaskRecord("plan", -1, at(1), at(2), at(4)),
        TaskRecord("batch.extract", 0, at(4), at(5), at(9)),
        TaskRecord("batch.extract", 1, at(4), at(6), at(8)),
        TaskRecord("report", -1, at(10), at(11), at(12)),
    ]
    found = breakdown(at(0), at(13), tasks, {})
    assert found["wall_s"] == 13
    assert found["run_start_s"] == 2  # the trigger to plan's start
    assert found["no_task_running_s"] == 3  # 4 to 5 and 9 to 11
    assert found["run_end_s"] == 1
    assert found["tasks"]["batch.extract"]["instances"] == 2
    assert found["tasks"]["batch.extract"]["queued_s"] == 3


def test_a_stage_tasks_time_splits_at_its_first_claim_and_last_commit():
    tasks = [TaskRecord("batch.embed", 3, at(0), at(1), at(10))]
    spans = {("embed", 3): LedgerSpan(at(3), at(9.5), 50)}
    row = breakdown(at(0), at(10), tasks, spans)["tasks"]["batch.embed"]
    assert (row["start_up_s"], row["work_s"], row["wrap_up_s"], row["items"]) == (2, 6.5, 0.5, 50)


def test_the_breakdown_reads_as_notes():
    tasks = [TaskRecord("batch.chunk", 0, None, at(1), at(3))]
    spans = {("chunk", 0): LedgerSpan(at(1.5), at(2.5), 5)}
    lines = describe(breakdown(at(0), at(4), tasks, spans))
    assert lines[0].startswith("wall 4.0 s: 1.0 s to the first task's start")
    assert "5 items: waiting on a peer 0.0 s, start-up 0.5 s, work 1.0 s, wrap-up 0.5 s" in lines[1]


def test_start_up_spent_while_a_peer_of_the_same_task_works_is_waiting_on_it():
    tasks = [
        TaskRecord("batch.extract", 0, None, at(0), at(5)),
        TaskRecord("batch.extract", 1, None, at(0), at(9)),
    ]
    spans = {
        ("extract", 0): LedgerSpan(at(1), at(5), 10),
        ("extract", 1): LedgerSpan(at(5.5), at(9), 10),
    }
    row = breakdown(at(0), at(9), tasks, spans)["tasks"]["batch.extract"]
    assert row["peer_wait_s"] == 4  # the second waited 1 to 5 while the first worked
    assert row["start_up_s"] == 1 + 1.5  # the first's own second, the second's 0 to 1 and 5 to 5.5
