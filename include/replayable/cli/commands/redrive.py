"""``replayable redrive``: the conf that redrives open dead letters; ``--trigger`` starts it.

The run is started through Airflow's REST API as an Airflow user, never with a password
flag (ADR 0064): ``--username`` with ``$AIRFLOW_PASSWORD`` (asked for at a terminal), or
the JWT in ``$AIRFLOW_TOKEN``.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import httpx
from rich.console import Console

from replayable import airflow_http, config, db, views
from replayable.cli.commands.rerun import trigger_commands
from replayable.cli.errors import UsageError
from replayable.cli.render import error, print_redrive
from replayable.vocabulary import PIPELINE_DAG_ID


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


def run(conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool) -> int:
    """Print the redrive; with ``--trigger`` start it (1 when no open letter matches)."""
    data = redrive_data(
        conn,
        args.stage,
        reason=args.reason,
        ids=args.ids,
        error_classes=args.error_class,
        since=args.since,
        until=args.until,
        by=args.by,
    )
    if args.trigger:
        if not data["letters"]:
            print_redrive(console, as_json, data)
            error("replayable: no open dead letter matches: nothing to redrive")
            return 1
        token = _airflow_token(args)
        started = airflow_http.trigger_run(
            args.airflow_url,
            token,
            data["dag_id"],
            data["conf"],
            note=f"Redrive of {data['letters']} {args.stage} dead letters: {args.reason}"[:1000],
        )
        data["run_id"] = str(started["dag_run_id"])
        path = airflow_http.run_path(data["dag_id"], data["run_id"])
        data["run_url"] = f"{args.airflow_url.rstrip('/')}/{path}"
    print_redrive(console, as_json, data)
    return 0


def _airflow_token(args: argparse.Namespace) -> str:
    """An Airflow JWT: a login of ``--username``, else ``$AIRFLOW_TOKEN``."""
    if args.username:
        password = config.airflow_password()
        if password is None:
            if not sys.stdin.isatty():
                raise UsageError(
                    f"set {config.AIRFLOW_PASSWORD_ENV} (or run at a terminal to be asked) "
                    f"to log in to Airflow as {args.username!r}"
                )
            password = getpass.getpass(f"Airflow password for {args.username}: ")
        try:
            return airflow_http.fetch_token(args.airflow_url, args.username, password)
        except httpx.HTTPError as err:
            raise UsageError(f"cannot reach Airflow at {args.airflow_url}: {err}") from err
    token = config.airflow_token()
    if not token:
        raise UsageError(
            f"--trigger needs Airflow credentials: --username (or ${config.AIRFLOW_USERNAME_ENV})"
            f" with ${config.AIRFLOW_PASSWORD_ENV}, or an Airflow JWT in "
            f"${config.AIRFLOW_TOKEN_ENV}"
        )
    return token
