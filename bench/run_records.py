"""Where a DAG run's time went, from its own records: Airflow's task instances and the ledger.

Airflow keeps, for each task instance, when it was queued, when it started and when it
ended; the ledger keeps, for each item a stage task took, when it was claimed
(``stage_runs.started_at``) and when its outcome was committed (``finished_at``). Put
together, a run's wall time splits into:

- **run start**: the trigger to the first task instance's start (the scheduler creating the
  run, queueing ``plan``, the executor starting its process);
- **no task running**: the moments between the first start and the last end when no task
  instance ran at all (scheduler loops between one task's end and the next one's start);
- **run end**: the last task instance's end to the run's final state;

and each stage task's own time into:

- **queued**: queued to started (waiting for an executor slot);
- **waiting on a peer**: the part of started-to-first-claim during which another instance
  of the same task was working (between its first claim and its last commit): extract
  batches queue for the machine's cores before they claim (ADR 0123), so this is mostly
  that queue;
- **start-up**: the rest of started to its first claim in the ledger (the task process, the
  imports, the DAG's parse, the connections, the stage's build, its plan and the claim);
- **work**: its first claim to its last commit (the stage's processing of its items);
- **wrap-up**: its last commit to its end (the batch's report, XCom, the process's exit).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx

from replayable import db

PAGE = 100


def _when(text: str | None) -> datetime | None:
    return None if not text else datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class TaskRecord:
    """One task instance as Airflow recorded it (``stage``: the ledger's name, or None)."""

    task_id: str
    map_index: int
    queued: datetime | None
    started: datetime
    ended: datetime

    @property
    def stage(self) -> str:
        return self.task_id.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class LedgerSpan:
    """The items one stage task took in the ledger: its first claim, its last commit."""

    first_claim: datetime
    last_commit: datetime
    items: int


def task_instances(http: httpx.Client, dag_id: str, run_id: str) -> list[TaskRecord]:
    """Every task instance of the run that started and ended, mapped ones included."""
    found: list[dict[str, Any]] = []
    while True:
        page = http.get(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances",
            params={"limit": PAGE, "offset": len(found)},
        )
        page.raise_for_status()
        body = page.json()
        found += body["task_instances"]
        if not body["task_instances"] or len(found) >= body["total_entries"]:
            break
    records = []
    for ti in found:
        started, ended = _when(ti.get("start_date")), _when(ti.get("end_date"))
        if started is None or ended is None:
            continue  # skipped, or never ran
        records.append(
            TaskRecord(ti["task_id"], ti["map_index"], _when(ti.get("queued_when")), started, ended)
        )
    return records


def ledger_spans(dsn: str, run_id: str) -> dict[tuple[str, int], LedgerSpan]:
    """Per (stage, map index), the run's first claim and last commit in ``stage_runs``."""
    with contextlib.closing(db.connect(dsn)) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT stage, coalesce(map_index, -1), min(started_at), max(finished_at), count(*)"
            " FROM replayable.stage_runs WHERE run_id = %s AND started_at IS NOT NULL"
            " AND finished_at IS NOT NULL GROUP BY 1, 2",
            (run_id,),
        )
        return {(stage, index): LedgerSpan(a, b, n) for stage, index, a, b, n in cur.fetchall()}


def _busy(intervals: Iterable[tuple[datetime, datetime]]) -> float:
    """Seconds covered by at least one of ``intervals``."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += (stop - start).total_seconds()
            end = stop
        elif stop > end:
            total += (stop - end).total_seconds()
            end = stop
    return total


def _overlap(start: datetime, end: datetime, spans: Iterable[tuple[datetime, datetime]]) -> float:
    """Seconds of [start, end] that at least one of ``spans`` covers."""
    clipped = [(max(a, start), min(b, end)) for a, b in spans]
    return _busy((a, b) for a, b in clipped if a < b)


def breakdown(
    run_start: datetime,
    run_end: datetime,
    tasks: Sequence[TaskRecord],
    spans: dict[tuple[str, int], LedgerSpan],
) -> dict[str, Any]:
    """The run's seconds by where they went (see the module's docstring)."""
    if not tasks:
        return {"wall_s": round((run_end - run_start).total_seconds(), 2), "tasks": {}}
    first = min(t.started for t in tasks)
    last = max(t.ended for t in tasks)
    span_s = (last - first).total_seconds()
    busy = _busy((t.started, t.ended) for t in tasks)
    by_task: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    working: dict[str, list[tuple[TaskRecord, datetime, datetime]]] = defaultdict(list)
    for t in tasks:
        span = spans.get((t.stage, t.map_index))
        if span is not None:
            working[t.task_id].append((t, span.first_claim, span.last_commit))
    for t in tasks:
        row = by_task[t.task_id]
        row["instances"] += 1
        row["seconds"] += (t.ended - t.started).total_seconds()
        if t.queued is not None:
            row["queued_s"] += max(0.0, (t.started - t.queued).total_seconds())
        span = spans.get((t.stage, t.map_index))
        if span is None:
            continue
        row["items"] += span.items
        peers = [(a, b) for other, a, b in working[t.task_id] if other is not t]
        waited = _overlap(t.started, span.first_claim, peers)
        row["peer_wait_s"] += waited
        row["start_up_s"] += max(0.0, (span.first_claim - t.started).total_seconds() - waited)
        row["work_s"] += max(0.0, (span.last_commit - span.first_claim).total_seconds())
        row["wrap_up_s"] += max(0.0, (t.ended - span.last_commit).total_seconds())
    return {
        "wall_s": round((run_end - run_start).total_seconds(), 2),
        "run_start_s": round((first - run_start).total_seconds(), 2),
        "no_task_running_s": round(span_s - busy, 2),
        "run_end_s": round((run_end - last).total_seconds(), 2),
        "tasks_running_on_average": round(
            sum((t.ended - t.started).total_seconds() for t in tasks) / span_s, 2
        )
        if span_s
        else 0.0,
        "tasks": {
            task: {key: round(value, 2) for key, value in row.items()}
            for task, row in by_task.items()
        },
    }


def describe(found: dict[str, Any]) -> list[str]:
    """The breakdown as lines for a benchmark's notes."""
    if not found.get("tasks"):
        return [f"wall {found['wall_s']:.1f} s, no task instance recorded"]
    lines = [
        f"wall {found['wall_s']:.1f} s: {found['run_start_s']:.1f} s to the first task's start, "
        f"{found['no_task_running_s']:.1f} s with no task running, {found['run_end_s']:.1f} s "
        f"from the last task's end; {found['tasks_running_on_average']:.2f} tasks running "
        "on average in between"
    ]
    for task, row in found["tasks"].items():
        line = (
            f"  {task}: {row['instances']:.0f} instance(s), {row['seconds']:.1f} task-s, "
            f"{row.get('queued_s', 0.0):.1f} s queued"
        )
        if "items" in row:
            line += (
                f"; {row['items']:.0f} items: waiting on a peer {row['peer_wait_s']:.1f} s, "
                f"start-up {row['start_up_s']:.1f} s, work "
                f"{row['work_s']:.1f} s, wrap-up {row['wrap_up_s']:.1f} s"
            )
        lines.append(line)
    return lines
