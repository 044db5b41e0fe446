"""``replayable rerun``: the DAG-run conf of a partial re-run, its query, and what it matches."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from rich.console import Console

from replayable import db, views
from replayable.cli.errors import UsageError
from replayable.cli.render import print_json, print_rerun
from replayable.read import rerun_conf, rerun_data

_DOC_ID = re.compile(r"[0-9a-f]{64}")


def run(conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool) -> int:
    """Print the re-run's conf, query and count; nothing is triggered."""
    conf = rerun_conf(
        args.stage,
        statuses=args.status,
        error_classes=args.error_class,
        code_version_lt=args.code_version_lt,
        since=args.since,
        doc_ids=_resolve_doc_ids(conn, args.doc_id) if args.doc_id else None,
    )
    data = rerun_data(conn, conf, args.dag_id)
    if as_json:
        print_json(data)
    else:
        print_rerun(console, data)
    return 0


def _resolve_doc_ids(conn: db.Connection, given: Sequence[str]) -> list[str]:
    """Full document ids for ids or unique prefixes (as ``failed`` shows them)."""
    found = []
    for value in given:
        if _DOC_ID.fullmatch(value):
            found.append(value)
            continue
        matches = views.documents_by_prefix(conn, value)
        if len(matches) != 1:
            what = "no document" if not matches else "more than one document"
            raise UsageError(f"argument --doc-id: {value!r} matches {what}")
        found.append(matches[0])
    return found
