"""``replayable failed`` and ``replayable dead-letters``: what failed, newest first."""

from __future__ import annotations

import argparse

from rich.console import Console

from replayable import db, views
from replayable.cli.render import dead_letters_table, emit, failed_table
from replayable.read import dead_letters_data, failed_data


def run_failed(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
    """Print the failed items of ``--stage`` and ``--error-class``."""
    data = failed_data(conn, args.stage, views.unique(args.error_class), args.limit)
    emit(console, as_json, data, failed_table)
    return 0


def run_dead_letters(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
    """Print the dead letters of ``--stage`` and ``--status``."""
    data = dead_letters_data(conn, args.stage, args.status, args.limit)
    emit(console, as_json, data, dead_letters_table)
    return 0
