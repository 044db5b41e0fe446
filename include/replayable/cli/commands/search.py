"""``replayable search``: the chunks nearest a question, through the model connection."""

from __future__ import annotations

import argparse

from rich.console import Console

from replayable import db
from replayable.cli.connection import resolve_dsn
from replayable.cli.errors import UsageError
from replayable.cli.render import emit, search_table
from replayable.search import SearchError, answer, cli_user


def run(conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool) -> int:
    """Print the ``--k`` chunks nearest the question, best first; the search is counted
    as the OS user's (``cli:<user>``), with no limit (ADR 0153)."""
    try:
        found = answer(
            conn,
            args.query,
            dsn=resolve_dsn(getattr(args, "dsn", None)),
            model=args.model,
            k=args.k,
            source=args.source,
            dag_id=args.dag_id,
            mode=args.mode,
            run_id=args.run,
            searched_by=cli_user(),
            dimensions=args.dimensions,
        )
    except SearchError as err:
        raise UsageError(str(err)) from None
    emit(console, as_json, found.as_dict(), search_table)
    return 0
