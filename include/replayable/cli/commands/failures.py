"""``replayable failed`` and ``replayable dead-letters``: what failed, newest first."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from replayable import db, views
from replayable.cli.render import dead_letters_table, emit, failed_table


def failed_data(
    conn: db.Connection, stage: str | None, error_classes: list[str] | None, limit: int
) -> dict[str, Any]:
    """Items whose current status is failed, newest first, and how many match in all."""
    page = views.failed_items(conn, stage=stage, error_classes=error_classes, limit=limit)
    return {"matched": page.matched, "items": page.rows}


def dead_letters_data(
    conn: db.Connection, stage: str | None, status: str, limit: int
) -> dict[str, Any]:
    """Dead letters (``status`` "all" for every status), newest first."""
    page = views.dead_letters(conn, stage=stage, status=status, limit=limit)
    return {"matched": page.matched, "dead_letters": page.rows}


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
