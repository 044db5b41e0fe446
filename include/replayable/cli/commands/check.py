"""``replayable check``: the ledger against its invariants (ADR 0150).

Read-only unless ``--record`` asks it to keep the counts for the metrics endpoint; exits 1
when any invariant is broken, so a cron job or a chaos scenario can act on it.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from replayable import db, invariants
from replayable.cli.render import check_tables, emit
from replayable.read import check_data


def run(conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool) -> int:
    """Print every violation (up to ``--limit`` per invariant); 1 when there is any."""
    data = check_data(conn, args.quiescent, args.limit)
    if args.record:
        conn.set_session(readonly=False, autocommit=True)  # the one write: the counts
        invariants.record_counts(conn, data["totals"], quiescent=args.quiescent)
    emit(console, as_json, data, check_tables)
    return 0 if data["clean"] else 1
