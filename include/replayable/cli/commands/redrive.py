"""``replayable redrive``: the conf that redrives open dead letters; ``--trigger`` starts it.

The run is started through Airflow's REST API as an Airflow user, never with a password
flag (ADR 0064): ``--username`` with ``$AIRFLOW_PASSWORD`` (asked for at a terminal), or
the JWT in ``$AIRFLOW_TOKEN``.
"""

from __future__ import annotations

import argparse
import getpass
import sys

import httpx
from rich.console import Console

from replayable import airflow_http, config, db
from replayable.cli.errors import UsageError
from replayable.cli.render import error, print_redrive
from replayable.read import redrive_data


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
