"""``replayable status`` and ``replayable check``: the state of every stage, and the invariants."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from replayable import db, invariants, mirror, views

_IN_PROGRESS = ("pending", "running")


def status_data(conn: db.Connection, run_id: str | None) -> dict[str, Any]:
    """Per stage: items by current status, open dead letters and model calls; plus totals
    and what the model calls cost.

    With ``run_id``, the run's own documents (``run_docs``) only, and ``finished`` says the
    run has ended: its report is written (the report task runs however the run went). For
    all runs, ``finished`` means that items exist and none is pending or running.
    """
    stages = [dataclasses.asdict(s) for s in views.stage_status(conn, run_id)]
    total = sum(s["total"] for s in stages)
    in_progress = sum(s[status] for s in stages for status in _IN_PROGRESS)
    # For a run, only its report says it ended: between two batches nothing may be running.
    # For all runs, no items yet means no run has registered any: keep waiting.
    run = views.run_state(conn, run_id) if run_id else None
    finished = bool(run and run["reported"]) if run_id else total > 0 and in_progress == 0
    return {
        "run_id": run_id,
        "as_of": datetime.now().astimezone().isoformat(timespec="seconds"),
        "stages": stages,
        "items": total,
        "in_progress": in_progress,
        "finished": finished,
        "model_calls": {
            k: sum(s["model_calls"][k] for s in stages) for k in ("calls", "ok", "tokens")
        },
        "open_dead_letters": sum(s["open_dead_letters"] for s in stages),
        # The run's calls, or for all runs those of the last COST_DAYS days (ADR 0110).
        "cost": views.model_costs(conn, run_id).as_dict(),
        "cost_days": None if run_id else views.COST_DAYS,
        # What left search because its sources lost it (ADR 0138): the run's, or all.
        "index": (
            mirror.run_counts(conn, dag_id=run["dag_id"], run_id=run["run_id"])
            if run
            else mirror.retracted(conn)
        ),
    }


def check_data(conn: db.Connection, quiescent: bool, limit: int) -> dict[str, Any]:
    """What the check found: counts per invariant, the first ``limit`` rows of each, and the
    items in flight (running under an expired lease)."""
    return invariants.run_check(conn, quiescent=quiescent, limit=limit).as_dict()
