"""The ``replayable`` argument parser, one small function per command.

Each ``_add_*`` function declares one command's options and sets its handler, a function of
:mod:`replayable.cli.commands` called as ``handler(conn, args, console, as_json)``.
"""

from __future__ import annotations

import argparse
from typing import Any

from replayable import config
from replayable.cli import arguments
from replayable.cli.arguments import non_empty, positive
from replayable.cli.commands import check, failures, outbox, redrive, rerun, search, status
from replayable.search.text import DEFAULT_MODE, MODES
from replayable.vocabulary import (
    DATABASE_URL_ENV,
    DEAD_LETTER_STATUSES,
    ITEM_STATUSES,
    LEDGER_CONN_ID,
    PIPELINE_DAG_ID,
    STAGES,
)

# Subparsers are argparse's private _SubParsersAction; Any keeps its name out of the types.
Commands = Any


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; ``--dsn`` and ``--json`` work before or after the command."""
    common = _common_options()
    parser = argparse.ArgumentParser(
        prog="replayable",
        description="Look at Replayable's ledger: progress, failures, dead letters, re-runs.",
        parents=[common],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_status,
        _add_failed,
        _add_dead_letters,
        _add_rerun,
        _add_redrive,
        _add_search,
        _add_check,
    ):
        add(sub, common)
    _add_outbox(sub, common)
    return parser


def _common_options() -> argparse.ArgumentParser:
    """``--dsn`` and ``--json``, a parent of the parser and of every command."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS keeps a subcommand's unset option from overwriting the one given before it.
    common.add_argument(
        "--dsn",
        default=argparse.SUPPRESS,
        help=f"libpq URI of the replayable database (default: ${DATABASE_URL_ENV}, "
        f"else Airflow's {LEDGER_CONN_ID} connection)",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print JSON for scripts instead of tables",
    )
    return common


def _add_status(sub: Commands, common: argparse.ArgumentParser) -> None:
    command = sub.add_parser(
        "status",
        parents=[common],
        help="items per stage by status, model calls, open dead letters",
        description="Per stage: items by their current status, progress (done + dead of "
        "all items), model calls and open dead letters.",
    )
    command.add_argument(
        "--run", metavar="RUN_ID", help="only the documents this DAG run touched (and its calls)"
    )
    command.add_argument(
        "--watch",
        metavar="SECONDS",
        type=positive(float),
        help="re-render every SECONDS until the run has ended (its report is written); "
        "without --run, follows the newest run",
    )
    command.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive(float),
        default=3600.0,
        help="stop watching after this long, exiting 1 (default: %(default)s)",
    )
    command.set_defaults(handler=status.run)


def _add_check(sub: Commands, common: argparse.ArgumentParser) -> None:
    command = sub.add_parser(
        "check",
        parents=[common],
        help="check the ledger against its invariants; exit 1 on any violation",
        description="Check the ledger against the invariants it can show alone (ADR 0150): "
        "one current item per stage; done, or dead with one open letter; a done item's "
        "outputs; no chunk claim without a live submission; counters and reports equal to "
        "the ledger. Prints each violation with its stage, document and item.",
    )
    command.add_argument(
        "--quiescent",
        action="store_true",
        help="no run, sweep or redrive is in progress: every current item must be done or "
        "dead, and the newest report must equal the ledger (without it, items running "
        "under an expired lease are listed as in flight, not as violations)",
    )
    command.add_argument(
        "--limit",
        type=positive(int),
        default=100,
        help="rows listed per invariant; all are counted (default: %(default)s)",
    )
    command.add_argument(
        "--record",
        action="store_true",
        help="keep the counts for the metrics endpoint (replayable_invariant_violations): "
        "the command's one write",
    )
    command.set_defaults(handler=check.run)


def _add_search(sub: Commands, common: argparse.ArgumentParser) -> None:
    command = sub.add_parser(
        "search",
        parents=[common],
        help="the chunks that best answer a question",
        description="Print the chunks of current documents that best answer QUERY: by the "
        "words they share with it and by their embeddings (QUERY embedded through the model "
        "connection), fused by reciprocal rank, or by either alone (--mode).",
    )
    command.add_argument("query", metavar="QUERY", help="a question, or some words")
    command.add_argument("--k", type=positive(int), default=10, help="(default: %(default)s)")
    command.add_argument(
        "--source", type=non_empty, metavar="PREFIX", help="only documents whose path starts so"
    )
    command.add_argument(
        "--model",
        type=non_empty,
        help="the embedding model whose vectors to search (default: the one that holds "
        "the current vectors)",
    )
    command.add_argument(
        "--mode",
        choices=MODES,
        default=DEFAULT_MODE,
        help="rank by vector, by shared words (text, no model call) or both (default: %(default)s)",
    )
    command.add_argument(
        "--dag-id",
        default=PIPELINE_DAG_ID,
        help="the pipeline whose settings name the vectors (default: %(default)s)",
    )
    command.add_argument(
        "--run",
        type=non_empty,
        metavar="RUN_ID",
        help="search under the settings this run of the pipeline used (default: those of "
        "its most recent complete run)",
    )
    command.add_argument(
        "--dimensions",
        type=arguments.dimensions,
        metavar="N",
        help="search the vectors asked of the model at N dimensions, 0 for its own size "
        "(default: those of the settings searched)",
    )
    command.set_defaults(handler=search.run)


def _add_failed(sub: Commands, common: argparse.ArgumentParser) -> None:
    command = sub.add_parser(
        "failed",
        parents=[common],
        help="items whose current status is failed",
        description="Items whose current status is failed (retryable, under the attempt cap).",
    )
    command.add_argument("--stage", type=arguments.stage, metavar="STAGE")
    command.add_argument("--error-class", nargs="+", type=non_empty, metavar="CLASS")
    command.add_argument("--limit", type=positive(int), default=50, help="(default: %(default)s)")
    command.set_defaults(handler=failures.run_failed)


def _add_dead_letters(sub: Commands, common: argparse.ArgumentParser) -> None:
    command = sub.add_parser(
        "dead-letters",
        parents=[common],
        help="the dead-letter queue",
        description="Dead letters, newest first.",
    )
    command.add_argument("--stage", type=arguments.stage, metavar="STAGE")
    command.add_argument(
        "--status",
        choices=(*DEAD_LETTER_STATUSES, "all"),
        default="open",
        help="(default: %(default)s)",
    )
    command.add_argument("--limit", type=positive(int), default=50, help="(default: %(default)s)")
    command.set_defaults(handler=failures.run_dead_letters)


def _add_rerun(sub: Commands, common: argparse.ArgumentParser) -> None:
    command = sub.add_parser(
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
    command.add_argument(
        "--stage",
        required=True,
        type=arguments.stage,
        metavar="STAGE",
        help=f"the stage to re-run from: {', '.join(STAGES)}, or one of your own",
    )
    command.add_argument(
        "--dag-id",
        default=PIPELINE_DAG_ID,
        type=arguments.dag_id,
        metavar="DAG",
        help="the pipeline DAG the re-run is a run of (default: %(default)s)",
    )
    command.add_argument(
        "--status",
        nargs="+",
        choices=ITEM_STATUSES,
        metavar="STATUS",
        help="only items with one of these statuses: %(choices)s (default: any)",
    )
    command.add_argument(
        "--error-class",
        nargs="+",
        type=non_empty,
        metavar="CLASS",
        help="only items that failed with one of these error classes, e.g. http_429",
    )
    command.add_argument(
        "--code-version-lt",
        metavar="VERSION",
        type=arguments.version,
        help="only items processed by an older code version, e.g. 1.10",
    )
    command.add_argument(
        "--since",
        metavar="ISO",
        type=arguments.since,
        help="only items updated at or after this ISO 8601 time (no zone = local time)",
    )
    command.add_argument(
        "--doc-id",
        nargs="+",
        type=arguments.doc_prefix,
        metavar="ID",
        help="document ids, or unique prefixes of at least 6 characters",
    )
    command.set_defaults(handler=rerun.run)


def _add_redrive(sub: Commands, common: argparse.ArgumentParser) -> None:
    command = sub.add_parser(
        "redrive",
        parents=[common],
        help="redrive open dead letters: print the conf and what it matches; --trigger runs it",
        description="Print the DAG-run conf that redrives STAGE's open dead letters (the\n"
        "ones given by --id, or every one matching the filters), how many letters and\n"
        "documents it matches now, and the commands that trigger it. With --trigger, start\n"
        "that run of document_pipeline through Airflow's REST API as an Airflow user:\n"
        f"--username (${config.AIRFLOW_USERNAME_ENV}) with the password in "
        f"${config.AIRFLOW_PASSWORD_ENV}\n"
        f"(asked for at a terminal), or else the one whose JWT is in "
        f"${config.AIRFLOW_TOKEN_ENV}.\n"
        "It prints the new run's id and its link in Airflow's UI.\n"
        "A filtered redrive ends when the letters are counted (--until, at the latest), so\n"
        "that letters arriving later are not taken along unseen.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  replayable redrive --stage embed --error-class http_400 "
        "--reason 'provider fixed' --trigger --username ana",
    )
    command.add_argument(
        "--stage",
        required=True,
        type=arguments.stage,
        metavar="STAGE",
        help=f"the stage to redrive: {', '.join(STAGES)}, or one of your own",
    )
    command.add_argument(
        "--id",
        dest="ids",
        nargs="+",
        type=arguments.letter_id,
        metavar="ID",
        help="dead-letter ids",
    )
    command.add_argument(
        "--error-class", nargs="+", type=non_empty, metavar="CLASS", help="e.g. http_400"
    )
    command.add_argument(
        "--since", metavar="ISO", type=arguments.since, help="letters created at or after this time"
    )
    command.add_argument(
        "--until", metavar="ISO", type=arguments.since, help="letters created before this time"
    )
    command.add_argument(
        "--reason",
        required=True,
        type=arguments.reason,
        help="why: kept with every letter redriven",
    )
    command.add_argument(
        "--by",
        type=non_empty,
        help="a free-text note kept with the redrive, e.g. a ticket (the Airflow user who "
        "triggers is always recorded as the actor)",
    )
    command.add_argument(
        "--trigger", action="store_true", help="start the run through Airflow's REST API"
    )
    _add_airflow_login(command)
    command.set_defaults(handler=redrive.run)


def _add_airflow_login(command: argparse.ArgumentParser) -> None:
    """Where ``--trigger`` reaches Airflow, and as whom (ADR 0064).

    No password flag: a command line is visible to every user of the machine and stays in
    shell history.
    """
    command.add_argument(
        "--airflow-url",
        default=config.airflow_url(),
        help=f"Airflow's URL (default: ${config.AIRFLOW_URL_ENV}, else %(default)s)",
    )
    command.add_argument(
        "--username",
        default=config.airflow_username(),
        help=f"log in to Airflow as this user (default: ${config.AIRFLOW_USERNAME_ENV}); "
        f"without one, ${config.AIRFLOW_TOKEN_ENV} is the Airflow JWT to use",
    )


def _add_outbox(sub: Commands, common: argparse.ArgumentParser) -> None:
    """``outbox list`` and ``outbox requeue``."""
    command = sub.add_parser(
        "outbox",
        parents=[common],
        help="the event outbox: its backlog and dead events; requeue dead ones",
        description="Events for the webhook: how many wait (the backlog), how many are dead,\n"
        "and each with its last error. `requeue` sends dead events again.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = command.add_subparsers(dest="outbox_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list",
        parents=[common],
        help="events of one status, oldest first, with the counts",
        description="Outbox events of one status, oldest first, with the counts per status and "
        "the age of the oldest pending event.",
    )
    listing.add_argument(
        "--status", choices=outbox.LISTED, default="dead", help="(default: %(default)s)"
    )
    listing.add_argument("--limit", type=positive(int), default=50, help="(default: %(default)s)")
    listing.set_defaults(handler=outbox.run_list)
    requeue = actions.add_parser(
        "requeue",
        parents=[common],
        help="send dead events again: pending, due now, attempts from zero",
        description="Make dead outbox events pending again, due now, with their attempts from "
        "zero; the next publish delivers them. Give --id, --error-class or --all.",
    )
    requeue.add_argument("--id", dest="ids", nargs="+", type=non_empty, metavar="EVENT_ID")
    requeue.add_argument(
        "--error-class", nargs="+", type=non_empty, metavar="CLASS", help="e.g. http_410"
    )
    requeue.add_argument("--all", action="store_true", help="every dead event")
    requeue.set_defaults(handler=outbox.run_requeue)
