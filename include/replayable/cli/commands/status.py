"""``replayable status``: items per stage by status, model calls, open dead letters; --watch."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.live import Live

from replayable import db, views
from replayable.cli.errors import UsageError
from replayable.cli.render import emit, error, print_json, status_tables
from replayable.read import status_data


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
