"""``replayable rerun``: the DAG-run conf of a partial re-run, its query, and what it matches."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Sequence
from typing import Any

from rich.console import Console

from replayable import db, views
from replayable.cli.errors import UsageError
from replayable.cli.render import print_json, print_rerun
from replayable.pipeline import rerun_params
from replayable.vocabulary import PIPELINE_DAG_ID

_DOC_ID = re.compile(r"[0-9a-f]{64}")


def rerun_conf(
    stage: str,
    *,
    statuses: Sequence[str] | None = None,
    error_classes: Sequence[str] | None = None,
    code_version_lt: str | None = None,
    since: str | None = None,
    doc_ids: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The DAG-run conf ``{"rerun": {...}}`` of params.py's schema, without unset keys."""
    rerun: dict[str, Any] = {"stage": stage}
    optional: dict[str, Any] = {
        "status": views.unique(statuses),
        "error_class": views.unique(error_classes),
        "code_version_lt": code_version_lt,
        "since": since,
        "doc_ids": views.unique(doc_ids),
    }
    rerun.update({key: value for key, value in optional.items() if value is not None})
    return {"rerun": rerun}


def rerun_data(
    conn: db.Connection, conf: dict[str, Any], dag_id: str = PIPELINE_DAG_ID
) -> dict[str, Any]:
    """The conf, the query and its bound values, the count it matches now, the commands."""
    rerun = conf["rerun"]
    params = rerun_params(rerun)
    return {
        "conf": conf,
        "sql_file": f"include/replayable/sql/queries/{views.RERUN_COUNT}.sql",
        "sql": db.sql(views.RERUN_COUNT),
        "params": params,
        "matching_documents": views.count_rerun_documents(conn, params),
        # Mirrors PipelineSettings.revives_dead: such a run reopens dead items.
        "revives_dead": "status" not in rerun or "dead" in rerun["status"],
        "commands": trigger_commands(conf, dag_id),
    }


def trigger_commands(conf: dict[str, Any], dag_id: str = PIPELINE_DAG_ID) -> list[str]:
    """The shell commands that trigger a run of the pipeline ``dag_id`` with ``conf``."""
    text = shlex.quote(json.dumps(conf))
    return [f"airflow dags trigger {shlex.quote(dag_id)} --conf {text}"]


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
