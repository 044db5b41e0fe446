"""The ``replayable`` command: ``replayable status|failed|dead-letters|rerun|redrive|outbox``.

Installed as a console script by ``make install`` (``pip install -e .``; ADR 0063), and
also ``python -m replayable`` where ``include/`` is on PYTHONPATH. Every command reads the
replayable database through a read-only session and the ``cli_*`` queries in
``sql/queries``; ``rerun`` and ``redrive`` print the DAG-run conf, what it matches now and
the commands that trigger it. Only ``redrive --trigger`` changes anything, and only through
Airflow: it triggers ``document_pipeline`` with Airflow's REST API, as the Airflow user
whose token or login it is given (ADR 0064). ``outbox requeue`` is the one command that
writes to the database itself: it sends dead outbox events again (ADR 0072). ``--json``
prints JSON for scripts instead of tables. Exit codes: 0 ok; 1 ``status --watch`` timed out
with the run unfinished, ``redrive --trigger`` found no open letter to redrive, or ``outbox
requeue`` found no dead event to requeue; 2 usage or connection problems, or Airflow
refused.

Text from the ledger (file names, errors, owners, notes, run ids) comes from documents and
the people and runs that handled them: tables show it through :func:`replayable.terminal.
for_terminal`, which replaces escape sequences and control characters, and JSON escapes them.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlparse

import httpx
import psycopg2
import psycopg2.errors
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from replayable import airflow_http, db, vocabulary
from replayable.pipeline import rerun_params
from replayable.settings import STAGES
from replayable.terminal import for_terminal

ENV_DSN = vocabulary.DATABASE_URL_ENV
# Where `redrive --trigger` reaches Airflow, and as whom (ADR 0064). No password flag: a
# command line is visible to every user of the machine and stays in shell history.
ENV_AIRFLOW_URL = "AIRFLOW_URL"
ENV_AIRFLOW_TOKEN = "AIRFLOW_TOKEN"  # noqa: S105 - the variable's name, not a token
ENV_AIRFLOW_USERNAME = "AIRFLOW_USERNAME"
ENV_AIRFLOW_PASSWORD = "AIRFLOW_PASSWORD"  # noqa: S105 - the variable's name
DEFAULT_AIRFLOW_URL = "http://127.0.0.1:8080"  # `make airflow`
# What a re-run selects (count_rerun_docs shows the same filters without recording a run).
RERUN_QUERY = "plan/select_rerun_docs"
RERUN_COUNT = "plan/count_rerun_docs"

# The same values as replayable.params (test_cli checks that they agree); importing params
# here would load Airflow, which costs seconds on every command.
ITEM_STATUSES = ("pending", "running", "done", "failed", "dead")
VERSION_PATTERN = r"^[0-9]{1,9}(\.[0-9]{1,9})*$"
DEAD_LETTER_STATUSES = ("open", "redriven", "ignored")
OUTBOX_STATUSES = ("pending", "published", "dead")
OUTBOX_LISTED = ("dead", "pending")  # published history is not listed: it only grows

_DOC_ID = re.compile(r"[0-9a-f]{64}")
_DOC_PREFIX = re.compile(r"[0-9a-f]{6,64}")
_IN_PROGRESS = ("pending", "running")
_ERROR_WIDTH = 60


class UsageError(Exception):
    """A problem the person at the terminal can fix; :func:`main` prints it and exits 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the process exit code."""
    args = build_parser().parse_args(argv)
    as_json = bool(getattr(args, "json", False))
    console = Console(highlight=False)
    dsn = ""
    try:
        dsn = resolve_dsn(getattr(args, "dsn", None))
        conn = _connect(dsn)
        try:
            return int(args.handler(conn, args, console, as_json))
        finally:
            conn.close()
    except UsageError as err:
        _error(f"replayable: {err}")
        return 2
    except (psycopg2.errors.UndefinedTable, psycopg2.errors.UndefinedFunction) as err:
        _error(
            f"replayable: the database has no replayable schema ({err.pgerror or err}).\n"
            "`airflow db migrate` (or the first task of a run) creates it."
        )
        return 2
    except psycopg2.OperationalError as err:
        _error(f"replayable: lost the database: {_redact(str(err), dsn)}")
        return 2
    except airflow_http.AirflowRefusedError as err:
        _error(f"replayable: Airflow refused: {err.status} {err.detail}")
        return 2
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``--dsn`` and ``--json`` work before or after the command."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS keeps a subcommand's unset option from overwriting the one given before it.
    common.add_argument(
        "--dsn",
        default=argparse.SUPPRESS,
        help=f"libpq URI of the replayable database (default: ${ENV_DSN}, "
        f"else Airflow's {vocabulary.LEDGER_CONN_ID} connection)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print JSON for scripts instead of tables",
    )
    parser = argparse.ArgumentParser(
        prog="replayable",
        description="Look at Replayable's ledger: progress, failures, dead letters, re-runs.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    status = sub.add_parser(
        "status",
        parents=[common],
        help="items per stage by status, model calls, open dead letters",
        description="Per stage: items by their current status, progress (done + dead of "
        "all items), model calls and open dead letters.",
    )
    status.add_argument(
        "--run", metavar="RUN_ID", help="only the documents this DAG run touched (and its calls)"
    )
    status.add_argument(
        "--watch",
        metavar="SECONDS",
        type=_positive(float),
        help="re-render every SECONDS until the run has ended (its report is written); "
        "without --run, follows the newest run",
    )
    status.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive(float),
        default=3600.0,
        help="stop watching after this long, exiting 1 (default: %(default)s)",
    )
    status.set_defaults(handler=_cmd_status)

    failed = sub.add_parser(
        "failed",
        parents=[common],
        help="items whose current status is failed",
        description="Items whose current status is failed (retryable, under the attempt cap).",
    )
    failed.add_argument("--stage", choices=STAGES)
    failed.add_argument("--error-class", nargs="+", type=_non_empty, metavar="CLASS")
    failed.add_argument("--limit", type=_positive(int), default=50, help="(default: %(default)s)")
    failed.set_defaults(handler=_cmd_failed)

    dead = sub.add_parser(
        "dead-letters",
        parents=[common],
        help="the dead-letter queue",
        description="Dead letters, newest first.",
    )
    dead.add_argument("--stage", choices=STAGES)
    dead.add_argument(
        "--status",
        choices=(*DEAD_LETTER_STATUSES, "all"),
        default="open",
        help="(default: %(default)s)",
    )
    dead.add_argument("--limit", type=_positive(int), default=50, help="(default: %(default)s)")
    dead.set_defaults(handler=_cmd_dead_letters)

    rerun = sub.add_parser(
        "rerun",
        parents=[common],
        help="build the DAG-run conf of a partial re-run and count what it matches",
        description="Print the conf that re-runs STAGE (and the stages after it) for the\n"
        "documents the ledger matches, the query it implies, how many documents match now,\n"
        "and the commands that trigger it. Nothing is triggered.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  replayable rerun --stage embed --status failed "
        "--error-class http_429 --code-version-lt 1.3",
    )
    rerun.add_argument(
        "--stage", required=True, choices=STAGES, help="the stage to re-run from: %(choices)s"
    )
    rerun.add_argument(
        "--status",
        nargs="+",
        choices=ITEM_STATUSES,
        metavar="STATUS",
        help="only items with one of these statuses: %(choices)s (default: any)",
    )
    rerun.add_argument(
        "--error-class",
        nargs="+",
        type=_non_empty,
        metavar="CLASS",
        help="only items that failed with one of these error classes, e.g. http_429",
    )
    rerun.add_argument(
        "--code-version-lt",
        metavar="VERSION",
        type=_version,
        help="only items processed by an older code version, e.g. 1.10",
    )
    rerun.add_argument(
        "--since",
        metavar="ISO",
        type=_since,
        help="only items updated at or after this ISO 8601 time (no zone = local time)",
    )
    rerun.add_argument(
        "--doc-id",
        nargs="+",
        type=_doc_prefix,
        metavar="ID",
        help="document ids, or unique prefixes of at least 6 characters",
    )
    rerun.set_defaults(handler=_cmd_rerun)

    redrive = sub.add_parser(
        "redrive",
        parents=[common],
        help="redrive open dead letters: print the conf and what it matches; --trigger runs it",
        description="Print the DAG-run conf that redrives STAGE's open dead letters (the\n"
        "ones given by --id, or every one matching the filters), how many letters and\n"
        "documents it matches now, and the commands that trigger it. With --trigger, start\n"
        "that run of document_pipeline through Airflow's REST API as an Airflow user:\n"
        f"--username (${ENV_AIRFLOW_USERNAME}) with the password in ${ENV_AIRFLOW_PASSWORD}\n"
        f"(asked for at a terminal), or else the one whose JWT is in ${ENV_AIRFLOW_TOKEN}.\n"
        "It prints the new run's id and its link in Airflow's UI.\n"
        "A filtered redrive ends when the letters are counted (--until, at the latest), so\n"
        "that letters arriving later are not taken along unseen.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  replayable redrive --stage embed --error-class http_400 "
        "--reason 'provider fixed' --trigger --username ana",
    )
    redrive.add_argument(
        "--stage", required=True, choices=STAGES, help="the stage to redrive: %(choices)s"
    )
    redrive.add_argument(
        "--id", dest="ids", nargs="+", type=_letter_id, metavar="ID", help="dead-letter ids"
    )
    redrive.add_argument(
        "--error-class", nargs="+", type=_non_empty, metavar="CLASS", help="e.g. http_400"
    )
    redrive.add_argument(
        "--since", metavar="ISO", type=_since, help="letters created at or after this time"
    )
    redrive.add_argument(
        "--until", metavar="ISO", type=_since, help="letters created before this time"
    )
    redrive.add_argument(
        "--reason", required=True, type=_reason, help="why: kept with every letter redriven"
    )
    redrive.add_argument(
        "--by",
        type=_non_empty,
        help="a free-text note kept with the redrive, e.g. a ticket (the Airflow user who "
        "triggers is always recorded as the actor)",
    )
    redrive.add_argument(
        "--trigger", action="store_true", help="start the run through Airflow's REST API"
    )
    redrive.add_argument(
        "--airflow-url",
        default=os.environ.get(ENV_AIRFLOW_URL) or DEFAULT_AIRFLOW_URL,
        help=f"Airflow's URL (default: ${ENV_AIRFLOW_URL}, else %(default)s)",
    )
    redrive.add_argument(
        "--username",
        default=os.environ.get(ENV_AIRFLOW_USERNAME),
        help=f"log in to Airflow as this user (default: ${ENV_AIRFLOW_USERNAME}); without "
        f"one, ${ENV_AIRFLOW_TOKEN} is the Airflow JWT to use",
    )
    redrive.set_defaults(handler=_cmd_redrive)
    _add_outbox_parser(sub, common)
    return parser


def _add_outbox_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``outbox list`` and ``outbox requeue``."""
    outbox = sub.add_parser(
        "outbox",
        parents=[common],
        help="the event outbox: its backlog and dead events; requeue dead ones",
        description="Events for the webhook: how many wait (the backlog), how many are dead,\n"
        "and each with its last error. `requeue` sends dead events again.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = outbox.add_subparsers(dest="outbox_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list",
        parents=[common],
        help="events of one status, oldest first, with the counts",
        description="Outbox events of one status, oldest first, with the counts per status and "
        "the age of the oldest pending event.",
    )
    listing.add_argument(
        "--status", choices=OUTBOX_LISTED, default="dead", help="(default: %(default)s)"
    )
    listing.add_argument("--limit", type=_positive(int), default=50, help="(default: %(default)s)")
    listing.set_defaults(handler=_cmd_outbox_list)
    requeue = actions.add_parser(
        "requeue",
        parents=[common],
        help="send dead events again: pending, due now, attempts from zero",
        description="Make dead outbox events pending again, due now, with their attempts from "
        "zero; the next publish delivers them. Give --id, --error-class or --all.",
    )
    requeue.add_argument("--id", dest="ids", nargs="+", type=_non_empty, metavar="EVENT_ID")
    requeue.add_argument(
        "--error-class", nargs="+", type=_non_empty, metavar="CLASS", help="e.g. http_410"
    )
    requeue.add_argument("--all", action="store_true", help="every dead event")
    requeue.set_defaults(handler=_cmd_outbox_requeue)


def resolve_dsn(explicit: str | None) -> str:
    """The DSN to use: ``--dsn``, else ``$REPLAYABLE_DATABASE_URL``, else Airflow's connection.

    The last is ``replayable_db`` as Airflow resolves it (an ``AIRFLOW_CONN_REPLAYABLE_DB``
    variable, a secrets backend or the metadata database), so on an Airflow host the CLI
    reads the ledger the DAGs write without being told where it is.
    """
    if explicit:
        return explicit
    from_env = os.environ.get(ENV_DSN)
    if from_env:
        return from_env
    try:
        from replayable.hooks import connection_dsn

        return connection_dsn(vocabulary.LEDGER_CONN_ID)
    # Not found, or no Airflow configured here: a message, not a traceback.
    except Exception as err:
        raise UsageError(
            f"no database given: set {ENV_DSN} (or pass --dsn), or define Airflow's "
            f"{vocabulary.LEDGER_CONN_ID} connection; in a source checkout, `make start` "
            "starts a local one and `make env` prints the exports"
        ) from err


def _connect(dsn: str) -> db.Connection:
    try:
        conn = db.connect(dsn)
    except psycopg2.ProgrammingError as err:  # libpq could not parse it
        raise UsageError(f"the database DSN is not valid: {_redact(str(err), dsn)}") from err
    except psycopg2.Error as err:
        raise UsageError(
            f"cannot connect to the database: {_redact(str(err), dsn)}\n"
            f"Is it running, and does {ENV_DSN} (or --dsn, or the connection) name it?"
        ) from err
    conn.set_session(readonly=True, autocommit=True)
    return conn


def _redact(message: str, dsn: str) -> str:
    """``message`` without the DSN or its password: driver errors may quote either."""
    secrets = {dsn.strip(), *re.findall(r"password\s*=\s*'?([^'\s]+)", dsn)}
    if "://" in dsn:
        with contextlib.suppress(ValueError):  # a malformed URI has no password to hide
            secrets.add(urlparse(dsn).password or "")
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        message = message.replace(secret, "***")
    return message.strip()


# ---- status ------------------------------------------------------------------------------


def run_state(conn: db.Connection, run_id: str | None) -> dict[str, Any] | None:
    """The run ``run_id`` (else the newest run) as the ledger records it; None if unknown."""
    rows = db.fetch_all(conn, "views/run_state", {"run_id": run_id})
    return rows[0] if rows else None


def status_data(conn: db.Connection, run_id: str | None) -> dict[str, Any]:
    """Per stage: items by current status, open dead letters and model calls; plus totals.

    With ``run_id``, the run's own documents (``run_docs``) only, and ``finished`` says the
    run has ended: its report is written (the report task runs however the run went). For
    all runs, ``finished`` means that items exist and none is pending or running.
    """
    params = {"run_id": run_id, "stages": list(STAGES)}
    items = {row["stage"]: row for row in db.fetch_all(conn, "views/status_stages", params)}
    calls = {row["stage"]: row for row in db.fetch_all(conn, "views/status_model_calls", params)}
    dead = {row["stage"]: row for row in db.fetch_all(conn, "views/status_dead_letters", params)}
    stages = []
    for stage in _stage_order({*items, *calls, *dead}):
        counts = items.get(stage, {})
        call = calls.get(stage, {})
        entry: dict[str, Any] = {"stage": stage}
        entry.update({status: int(counts.get(status, 0)) for status in ITEM_STATUSES})
        entry["total"] = int(counts.get("total", 0))
        entry["open_dead_letters"] = int(dead.get(stage, {}).get("n_open", 0))
        entry["model_calls"] = {k: int(call.get(k, 0)) for k in ("calls", "ok", "tokens")}
        stages.append(entry)
    total = sum(s["total"] for s in stages)
    in_progress = sum(s[status] for s in stages for status in _IN_PROGRESS)
    # For a run, only its report says it ended: between two batches nothing may be running.
    # For all runs, no items yet means no run has registered any: keep waiting.
    run = run_state(conn, run_id) if run_id else None
    finished = bool(run and run["reported"]) if run_id else total > 0 and in_progress == 0
    return {
        "run_id": run_id,
        "as_of": datetime.now().astimezone().isoformat(timespec="seconds"),
        "stages": stages,
        "items": total,
        "in_progress": in_progress,
        "finished": finished,
        "model_calls": {
            k: sum(s["model_calls"][k] for s in stages) for k in ("calls", "ok", "tokens")
        },
        "open_dead_letters": sum(s["open_dead_letters"] for s in stages),
    }


def render_status(data: dict[str, Any]) -> RenderableType:
    """Tables of :func:`status_data`: items with a progress bar per stage, then model calls."""
    scope = f"run {data['run_id']}" if data["run_id"] else "all runs"
    items = Table(title=f"Items by stage ({scope})", caption=f"as of {data['as_of']}")
    items.add_column("Stage")
    for name in ("Pending", "Running", "Done", "Failed", "Dead", "Open DLQ"):
        items.add_column(name, justify="right")
    items.add_column("Progress (done + dead)", min_width=24)
    for s in data["stages"]:
        finished = s["done"] + s["dead"]
        bar = ProgressBar(total=max(s["total"], 1), completed=finished, width=12)
        share = f"{finished / s['total']:.0%}" if s["total"] else "-"
        progress = Table.grid(padding=(0, 1))
        progress.add_row(bar, Text(f"{finished}/{s['total']} {share}"))
        items.add_row(
            _cell(s["stage"]),
            *(_number(s[key]) for key in (*ITEM_STATUSES, "open_dead_letters")),
            progress,
        )

    calls = Table(title="Model calls")
    calls.add_column("Stage")
    for name in ("Calls", "OK", "Tokens"):
        calls.add_column(name, justify="right")
    for s in data["stages"]:
        if s["model_calls"]["calls"]:
            calls.add_row(_cell(s["stage"]), *_numbers(s["model_calls"].values()))
    calls.add_row(Text("all", style="bold"), *_numbers(data["model_calls"].values()))
    return Group(items, calls)


def _cmd_status(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
    if args.watch is not None and args.run is None:
        # Watching means following a run: the newest one, when none is named.
        newest = run_state(conn, None)
        if newest is None:
            raise UsageError("no run is recorded yet: nothing to watch (give --run RUN_ID)")
        args.run = newest["run_id"]
    data = status_data(conn, args.run)
    if args.watch is None:
        _emit(console, as_json, data, render_status)
        return 0
    deadline = time.monotonic() + args.timeout
    if as_json:
        # One object a line, so that a script can follow the run as it goes.
        _print_json(data, indent=None)
        while not data["finished"] and _sleep_until(deadline, args.watch):
            data = status_data(conn, args.run)
            _print_json(data, indent=None)
    else:
        with Live(render_status(data), console=console, auto_refresh=False) as live:
            while not data["finished"] and _sleep_until(deadline, args.watch):
                data = status_data(conn, args.run)
                live.update(render_status(data), refresh=True)
    if data["finished"]:
        return 0
    _error(
        f"replayable: timed out after {args.timeout:g}s before run {args.run} ended, with "
        f"{data['in_progress']} of {data['items']} items pending or running"
    )
    return 1


def _sleep_until(deadline: float, interval: float) -> bool:
    """Sleep ``interval`` (less near the deadline); False once the deadline has passed."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    time.sleep(min(interval, remaining))
    return True


# ---- failed and dead-letters -------------------------------------------------------------


def failed_data(
    conn: db.Connection, stage: str | None, error_classes: list[str] | None, limit: int
) -> dict[str, Any]:
    """Items whose current status is failed, newest first, and how many match in all."""
    params = {
        "stage": stage,
        "error_classes": error_classes,
        "limit": limit,
        "after_updated_at": None,
        "after_stage": None,
        "after_doc_id": None,
    }
    rows = db.fetch_all(conn, "views/failed_items", params)
    return {"matched": _matched(rows), "items": rows}


def render_failed(data: dict[str, Any]) -> RenderableType:
    """A table of :func:`failed_data`."""
    table = Table(title="Failed items", caption=_shown(len(data["items"]), data["matched"]))
    # Short fields stay on one line; the long ones give way in a narrow terminal.
    table.add_column("Stage", no_wrap=True)
    table.add_column("Doc", no_wrap=True)
    table.add_column("File", overflow="fold")
    table.add_column("Try", justify="right", no_wrap=True)
    table.add_column("Error class", no_wrap=True)
    table.add_column("Last error", overflow="fold")
    table.add_column("Updated", overflow="fold")
    for row in data["items"]:
        table.add_row(
            _cell(row["stage"]),
            _cell(row["doc_id"][:12]),
            _cell(_file_name(row["uri"])),
            _number(row["attempts"]),
            _cell(row["error_class"]),
            _cell(_one_line(row["last_error"], _ERROR_WIDTH)),
            Text(_when(row["updated_at"])),
        )
    return table


def _cmd_failed(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
    data = failed_data(conn, args.stage, _unique(args.error_class), args.limit)
    _emit(console, as_json, data, render_failed)
    return 0


def dead_letters_data(
    conn: db.Connection, stage: str | None, status: str, limit: int
) -> dict[str, Any]:
    """Dead letters (``status`` "all" for every status), newest first."""
    params = {
        "stage": stage,
        "status": None if status == "all" else status,
        "error_classes": None,
        "since": None,
        "until": None,
        "limit": limit,
        "after_created_at": None,
        "after_id": None,
    }
    rows = db.fetch_all(conn, "views/list_dead_letters", params)
    return {"matched": _matched(rows), "dead_letters": rows}


def render_dead_letters(data: dict[str, Any]) -> RenderableType:
    """A table of :func:`dead_letters_data`.

    Twelve fields do not fit 100 columns side by side, so related ones share a cell on two
    lines, as the two-line headers say.
    """
    table = Table(title="Dead letters", caption=_shown(len(data["dead_letters"]), data["matched"]))
    table.add_column("ID", justify="right", no_wrap=True)
    table.add_column("Stage", no_wrap=True)
    table.add_column("File", overflow="fold")
    table.add_column("Error class\ntries · ver", no_wrap=True)
    table.add_column("Run\nmap index", overflow="fold")
    table.add_column("Status\nowner", no_wrap=True)
    table.add_column("Note", overflow="fold")
    table.add_column("Created", overflow="fold")
    for row in data["dead_letters"]:
        map_index = "" if row["map_index"] is None else f"map {row['map_index']}"
        table.add_row(
            _number(row["id"]),
            _cell(row["stage"]),
            _cell(_file_name(row["uri"])),
            _two_lines(row["error_class"], f"{row['attempts']} · v{row['code_version']}"),
            _two_lines(row["run_id"] or "", map_index),
            _two_lines(row["status"], row["owner"] or "unowned"),
            _cell(_one_line(row["note"], 80)),
            Text(_when(row["created_at"])),
        )
    return table


def _cmd_dead_letters(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
    _emit(
        console,
        as_json,
        dead_letters_data(conn, args.stage, args.status, args.limit),
        render_dead_letters,
    )
    return 0


# ---- rerun -------------------------------------------------------------------------------


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
        "status": _unique(statuses),
        "error_class": _unique(error_classes),
        "code_version_lt": code_version_lt,
        "since": since,
        "doc_ids": _unique(doc_ids),
    }
    rerun.update({key: value for key, value in optional.items() if value is not None})
    return {"rerun": rerun}


def rerun_data(conn: db.Connection, conf: dict[str, Any]) -> dict[str, Any]:
    """The conf, the query and its bound values, the count it matches now, the commands."""
    rerun = conf["rerun"]
    params = rerun_params(rerun)
    matching = int(db.fetch_all(conn, RERUN_COUNT, params)[0]["matched"])
    return {
        "conf": conf,
        "sql_file": f"include/replayable/sql/queries/{RERUN_COUNT}.sql",
        "sql": db.sql(RERUN_COUNT),
        "params": params,
        "matching_documents": matching,
        # Mirrors PipelineSettings.revives_dead: such a run reopens dead items.
        "revives_dead": "status" not in rerun or "dead" in rerun["status"],
        "commands": _trigger_commands(conf),
    }


def _trigger_commands(conf: dict[str, Any]) -> list[str]:
    """The shell commands that trigger a run of document_pipeline with ``conf``."""
    text = shlex.quote(json.dumps(conf))
    return [f"airflow dags trigger {vocabulary.PIPELINE_DAG_ID} --conf {text}"]


def _cmd_rerun(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
    conf = rerun_conf(
        args.stage,
        statuses=args.status,
        error_classes=args.error_class,
        code_version_lt=args.code_version_lt,
        since=args.since,
        doc_ids=_resolve_doc_ids(conn, args.doc_id) if args.doc_id else None,
    )
    data = rerun_data(conn, conf)
    if as_json:
        _print_json(data)
        return 0
    console.rule("DAG-run conf")
    console.print(_syntax(json.dumps(conf, indent=2), "json"))
    console.rule(f"Query: {data['sql_file']}")
    console.print(_syntax(data["sql"].strip(), "sql"))
    bound = Table(title="Bound parameters (NULL = any)")
    bound.add_column("Name")
    bound.add_column("Value", overflow="fold")
    for name, value in data["params"].items():
        bound.add_row(Text(name), Text("NULL" if value is None else json.dumps(value)))
    console.print(bound)
    console.print(Text(f"Documents matching now: {data['matching_documents']}", style="bold"))
    if data["revives_dead"]:
        console.print(
            Text(
                "This re-run includes dead items: it reopens them with a fresh attempt budget "
                "and marks their open dead letters redriven.",
                style="yellow",
            )
        )
    console.rule("Trigger it with")
    for command in data["commands"]:
        # soft_wrap: a wrapped command would paste as two.
        console.print(Text(command), soft_wrap=True)
    return 0


def _resolve_doc_ids(conn: db.Connection, given: Sequence[str]) -> list[str]:
    """Full document ids for ids or unique prefixes (as ``failed`` shows them)."""
    found = []
    for value in given:
        if _DOC_ID.fullmatch(value):
            found.append(value)
            continue
        rows = db.fetch_all(conn, "views/docs_by_prefix", {"prefix": value})
        if len(rows) != 1:
            what = "no document" if not rows else "more than one document"
            raise UsageError(f"argument --doc-id: {value!r} matches {what}")
        found.append(rows[0]["doc_id"])
    return found


# ---- redrive -----------------------------------------------------------------------------


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
    params = {
        "ids": _unique_ids(ids),
        "stage": stage,
        "error_classes": _unique(error_classes),
        "since": since,
        "until": until,
    }
    rows = db.fetch_all(conn, "plan/redrive_scope", params)
    found: dict[str, Any] = rows[0] if rows else {"letters": 0, "documents": 0, "as_of": None}
    selection: dict[str, Any] = {"stage": stage}
    optional: dict[str, Any] = {
        "ids": params["ids"],
        "error_class": params["error_classes"],
        "since": since,
        "until": until,
    }
    if ids is None and found["as_of"] is not None:
        as_of = found["as_of"].isoformat()
        later = until is not None and datetime.fromisoformat(until) > found["as_of"]
        optional["until"] = as_of if until is None or later else until
    selection.update({key: value for key, value in optional.items() if value is not None})
    selection["reason"] = reason
    if by:
        selection["by"] = by
    conf = {"redrive": selection}
    return {
        "conf": conf,
        "letters": int(found["letters"]),
        "documents": int(found["documents"]),
        "commands": _trigger_commands(conf),
    }


def _cmd_redrive(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
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
            _print_redrive(console, as_json, data)
            _error("replayable: no open dead letter matches: nothing to redrive")
            return 1
        token = _airflow_token(args)
        run = airflow_http.trigger_run(
            args.airflow_url,
            token,
            vocabulary.PIPELINE_DAG_ID,
            data["conf"],
            note=f"Redrive of {data['letters']} {args.stage} dead letters: {args.reason}"[:1000],
        )
        data["run_id"] = str(run["dag_run_id"])
        path = airflow_http.run_path(vocabulary.PIPELINE_DAG_ID, data["run_id"])
        data["run_url"] = f"{args.airflow_url.rstrip('/')}/{path}"
    _print_redrive(console, as_json, data)
    return 0


def _print_redrive(console: Console, as_json: bool, data: dict[str, Any]) -> None:
    if as_json:
        _print_json(data)
        return
    console.rule("DAG-run conf")
    console.print(_syntax(json.dumps(data["conf"], indent=2), "json"))
    console.print(
        Text(
            f"Open dead letters matching now: {data['letters']} ({data['documents']} documents)",
            style="bold",
        )
    )
    if "run_id" in data:
        console.rule("Triggered")
        console.print(Text(f"run {for_terminal(data['run_id'])}"), soft_wrap=True)
        console.print(Text(for_terminal(data["run_url"])), soft_wrap=True)
        return
    console.rule("Trigger it with")
    console.print(Text("replayable redrive … --trigger  (this command, with --trigger)"))
    for command in data["commands"]:
        console.print(Text(command), soft_wrap=True)


def _airflow_token(args: argparse.Namespace) -> str:
    """An Airflow JWT: a login of ``--username``, else ``$AIRFLOW_TOKEN``."""
    if args.username:
        password = os.environ.get(ENV_AIRFLOW_PASSWORD)
        if password is None:
            if not sys.stdin.isatty():
                raise UsageError(
                    f"set {ENV_AIRFLOW_PASSWORD} (or run at a terminal to be asked) "
                    f"to log in to Airflow as {args.username!r}"
                )
            password = getpass.getpass(f"Airflow password for {args.username}: ")
        try:
            return airflow_http.fetch_token(args.airflow_url, args.username, password)
        except httpx.HTTPError as err:
            raise UsageError(f"cannot reach Airflow at {args.airflow_url}: {err}") from err
    token = os.environ.get(ENV_AIRFLOW_TOKEN)
    if not token:
        raise UsageError(
            f"--trigger needs Airflow credentials: --username (or ${ENV_AIRFLOW_USERNAME}) "
            f"with ${ENV_AIRFLOW_PASSWORD}, or an Airflow JWT in ${ENV_AIRFLOW_TOKEN}"
        )
    return token


# ---- argument types ----------------------------------------------------------------------


def _letter_id(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 0 < number < 2**63:
        raise argparse.ArgumentTypeError(f"{value!r} is not a dead-letter id")
    return number


def _reason(value: str) -> str:
    text = value.strip()
    if len(text) < 3 or re.search(r"[\x00-\x1f\x7f-\x9f]", text):
        raise argparse.ArgumentTypeError("give a reason of 3 or more characters on one line")
    return text


def _version(value: str) -> str:
    if not re.fullmatch(VERSION_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not a version such as 1.2 or 1.10.3")
    return value


def _since(value: str) -> str:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 time such as 2024-05-01 or 2024-05-01T12:00:00Z"
        ) from None
    # The conf must name its zone to mean the same on every worker.
    return moment.astimezone().isoformat()


def _doc_prefix(value: str) -> str:
    value = value.strip().lower()
    if not _DOC_PREFIX.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a document id (sha256 hex) or a prefix of 6 or more of its digits"
        )
    return value


def _non_empty(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    def convert(value: str) -> Any:
        try:
            number = kind(value)
        except ValueError:
            number = 0
        if number <= 0:
            raise argparse.ArgumentTypeError(f"{value!r} is not a positive number")
        return number

    convert.__name__ = kind.__name__  # argparse names the type in its messages
    return convert


# ---- outbox ------------------------------------------------------------------------------


def outbox_data(conn: db.Connection, status: str, limit: int) -> dict[str, Any]:
    """Counts per status (from the counters), the backlog's age, and events of ``status``."""
    found = {row["status"]: int(row["n"]) for row in db.fetch_all(conn, "metrics/outbox")}
    oldest = db.fetch_all(conn, "outbox/oldest_pending")
    events = db.fetch_all(conn, "views/outbox_events", {"status": status, "limit": limit})
    return {
        "counts": {s: found.get(s, 0) for s in OUTBOX_STATUSES},
        "oldest_pending_age_s": float(oldest[0]["age_s"]) if oldest else None,
        "status": status,
        "events": events,
    }


def render_outbox(data: dict[str, Any]) -> RenderableType:
    """A table of :func:`outbox_data`; the caption has the counts and the backlog's age."""
    counts = data["counts"]
    age = data["oldest_pending_age_s"]
    waiting = f", the oldest for {_duration(age)}" if age is not None else ""
    caption = (
        f"{counts['pending']:,} pending{waiting}; {counts['dead']:,} dead; "
        f"{counts['published']:,} published"
    )
    table = Table(title=f"Outbox: {data['status']} events, oldest first", caption=caption)
    table.add_column("Seq", justify="right", no_wrap=True)
    table.add_column("Event\ntype", overflow="fold")
    table.add_column("Document", no_wrap=True)
    table.add_column("Tries", justify="right", no_wrap=True)
    table.add_column("Error class", no_wrap=True)
    table.add_column("Last error", overflow="fold")
    table.add_column("Created", overflow="fold")
    for row in data["events"]:
        table.add_row(
            _number(row["seq"]),
            _two_lines(row["event_id"], row["event_type"]),
            _cell(row["doc_id"][:12]),
            _number(row["attempts"]),
            _cell(row["error_class"]),
            _cell(_one_line(row["last_error"], _ERROR_WIDTH)),
            Text(_when(row["created_at"])),
        )
    return table


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"


def _cmd_outbox_list(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
    _emit(console, as_json, outbox_data(conn, args.status, args.limit), render_outbox)
    return 0


def _cmd_outbox_requeue(
    conn: db.Connection, args: argparse.Namespace, console: Console, as_json: bool
) -> int:
    if not (args.ids or args.error_class or args.all):
        raise UsageError("say which dead events to requeue: --id, --error-class, or --all")
    conn.set_session(readonly=False, autocommit=True)  # the one write: a single statement
    params = {"event_ids": _unique(args.ids), "error_classes": _unique(args.error_class)}
    rows = sorted(db.fetch_all(conn, "outbox/requeue", params), key=lambda row: row["seq"])
    requeued = [row["event_id"] for row in rows]
    if as_json:
        _print_json({"requeued": requeued})
    else:
        console.print(
            f"requeued {len(requeued)} dead event(s); the next publish delivers them"
            if requeued
            else "no dead event matched"
        )
    return 0 if requeued else 1


# ---- output ------------------------------------------------------------------------------


def _emit(
    console: Console,
    as_json: bool,
    data: dict[str, Any],
    render: Callable[[dict[str, Any]], RenderableType],
) -> None:
    if as_json:
        _print_json(data)
    else:
        console.print(render(data))


def _print_json(data: Any, indent: int | None = 2) -> None:
    # ensure_ascii: escape sequences and controls from documents are written as \u001b etc.,
    # never raw; a script that loads the JSON gets the text exactly as stored.
    text = json.dumps(data, indent=indent, default=_json_default, ensure_ascii=True)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _error(message: str) -> None:
    """Print ``message`` to stderr, line by line through :func:`for_terminal`."""
    print("\n".join(for_terminal(line) for line in message.split("\n")), file=sys.stderr)


def _cell(text: str | None) -> Text:
    """A table cell of text from the ledger, safe for the terminal."""
    return Text(for_terminal(text or ""))


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _syntax(code: str, lexer: str) -> Syntax:
    return Syntax(code, lexer, background_color="default", word_wrap=True)


def _stage_order(found: Iterable[str]) -> list[str]:
    """The pipeline's stages in order (even when empty), then any others by name."""
    return [*STAGES, *sorted(set(found) - set(STAGES))]


def _matched(rows: list[dict[str, Any]]) -> int:
    """Take the window count off every row; it is the same on each."""
    counts = [int(row.pop("matched")) for row in rows]
    return counts[0] if counts else 0


def _shown(shown: int, matched: int) -> str:
    return f"{shown} of {matched}" if shown < matched else f"{matched} in all"


def _unique(values: Sequence[str] | None) -> list[str] | None:
    return list(dict.fromkeys(values)) if values else None


def _unique_ids(values: Sequence[int] | None) -> list[int] | None:
    return list(dict.fromkeys(values)) if values else None


def _number(value: int) -> Text:
    return Text(f"{value:,}")


def _numbers(values: Iterable[int]) -> list[Text]:
    return [_number(v) for v in values]


def _file_name(uri: str | None) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] if uri else "?"


def _one_line(text: str | None, width: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _two_lines(first: str, second: str) -> Text:
    first, second = for_terminal(first), for_terminal(second)
    return Text.assemble(first, "\n", (second, "dim")) if second else Text(first)


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M") if moment else ""
