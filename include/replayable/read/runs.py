"""``replayable rerun`` and ``replayable redrive``: a run's conf, and what it would take now.

Nothing here triggers a run: each function returns the DAG-run conf of ``params.py``'s
schema, what it matches in the ledger now, and the shell commands that would start it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from replayable import db, views
from replayable.pipeline import rerun_params
from replayable.vocabulary import PIPELINE_DAG_ID


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


def redrive_data(
    conn: db.Connection,
    stage: str,
    *,
    reason: str,
    ids: Sequence[int] | None = None,
    error_classes: Sequence[str] | None = None,
    since: str | None = None,
    until: str | None = None,
    by: str | None = None,
) -> dict[str, Any]:
    """The ``{"redrive": {...}}`` conf of params.py's schema and the open letters it matches.

    Without ``ids``, the conf ends at ``until`` or, at the latest, when the database counted
    the matches, as the UI's filtered redrive does: what is shown is what the run takes.
    """
    unique_ids, classes = views.unique(ids), views.unique(error_classes)
    scopes = views.redrive_scope(
        conn, ids=unique_ids, stage=stage, error_classes=classes, since=since, until=until
    )
    found = scopes[0] if scopes else None
    selection: dict[str, Any] = {"stage": stage}
    optional: dict[str, Any] = {
        "ids": unique_ids,
        "error_class": classes,
        "since": since,
        "until": until,
    }
    if ids is None and found is not None:
        as_of = found.as_of.isoformat()
        later = until is not None and datetime.fromisoformat(until) > found.as_of
        optional["until"] = as_of if until is None or later else until
    selection.update({key: value for key, value in optional.items() if value is not None})
    selection["reason"] = reason
    if by:
        selection["by"] = by
    conf = {"redrive": selection}
    return {
        "conf": conf,
        "letters": found.letters if found else 0,
        "documents": found.documents if found else 0,
        "dag_id": found.dag_id if found else PIPELINE_DAG_ID,
        "commands": trigger_commands(conf, found.dag_id if found else PIPELINE_DAG_ID),
    }
