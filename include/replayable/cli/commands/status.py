"""``replayable status``: items per stage by status, model calls, open dead letters; --watch."""

from __future__ import annotations

import argparse
import dataclasses
import time
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.live import Live

from replayable import db, mirror, views
from replayable.cli.errors import UsageError
from replayable.cli.render import emit, error, print_json, status_tables

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


def run(conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool) -> int:
    """Print the status once, or with ``--watch`` until the run ends (1 on timeout)."""
    if args.watch is not None and args.run is None:
        # Watching means following a run: the newest one, when none is named.
        newest = views.run_state(conn, None)
        if newest is None:
            raise UsageError("no run is recorded yet: nothing to watch (give --run RUN_ID)")
        args.run = newest["run_id"]
    data = status_data(conn, args.run)
    if args.watch is None:
        emit(console, as_json, data, status_tables)
        return 0
    deadline = time.monotonic() + args.timeout
    if as_json:
        # One object a line, so that a script can follow the run as it goes.
        print_json(data, indent=None)
        while not data["finished"] and _sleep_until(deadline, args.watch):
            data = status_data(conn, args.run)
            print_json(data, indent=None)
    else:
        with Live(status_tables(data), console=console, auto_refresh=False) as live:
            while not data["finished"] and _sleep_until(deadline, args.watch):
                data = status_data(conn, args.run)
                live.update(status_tables(data), refresh=True)
    if data["finished"]:
        return 0
    error(
        f"replayable: timed out after {args.timeout:g}s before run {args.run} ended, with "
        f"{data['in_progress']} of {data['items']} items pending or running"
    )
    return 1


def _sleep_until(deadline: float, interval: float) -> bool:
    """Sleep ``interval`` (less near the deadline); False once the deadline has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    time.sleep(min(interval, remaining))
    return True
