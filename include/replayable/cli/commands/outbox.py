"""``replayable outbox list|requeue``: the event backlog, dead events, and sending them again.

``requeue`` is the one command that writes to the database itself (ADR 0072).
"""

from __future__ import annotations

import argparse

from rich.console import Console

from replayable import db, views
from replayable.cli.errors import UsageError
from replayable.cli.render import emit, outbox_table, print_json
from replayable.read import outbox_data

# The statuses ``list`` shows: published history is not listed, it only grows.
LISTED = ("dead", "pending")


def run_list(conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool) -> int:
    """Print the counts and the events of ``--status``."""
    emit(console, as_json, outbox_data(conn, args.status, args.limit), outbox_table)
    return 0


def run_requeue(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
    """Make the chosen dead events pending again; 1 when none matched."""
    if not (args.ids or args.error_class or args.all):
        raise UsageError("say which dead events to requeue: --id, --error-class, or --all")
    conn.set_session(readonly=False, autocommit=True)  # the one write: a single statement
    params = {"event_ids": views.unique(args.ids), "error_classes": views.unique(args.error_class)}
    rows = sorted(db.fetch_all(conn, "outbox/requeue", params), key=lambda row: row["seq"])
    requeued = [row["event_id"] for row in rows]
    if as_json:
        print_json({"requeued": requeued})
    else:
        console.print(
            f"requeued {len(requeued)} dead event(s); the next publish delivers them"
            if requeued
            else "no dead event matched"
        )
    return 0 if requeued else 1
