"""Run one command: parse, connect, call its handler, and turn failures into exit codes."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg2
import psycopg2.errors
from rich.console import Console

from replayable import airflow_http
from replayable.cli.connection import connect, redact, resolve_dsn
from replayable.cli.errors import UsageError
from replayable.cli.parser import build_parser
from replayable.cli.render import error


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the process exit code."""
    args = build_parser().parse_args(argv)
    as_json = bool(getattr(args, "json", False))
    console = Console(highlight=False)
    dsn = ""
    try:
        dsn = resolve_dsn(getattr(args, "dsn", None))
        conn = connect(dsn)
        try:
            return int(args.handler(conn, args, console, as_json))
        finally:
            conn.close()
    except UsageError as err:
        error(f"replayable: {err}")
        return 2
    except (psycopg2.errors.UndefinedTable, psycopg2.errors.UndefinedFunction) as err:
        error(
            f"replayable: the database has no replayable schema ({err.pgerror or err}).\n"
            "`airflow db migrate` (or the first task of a run) creates it."
        )
        return 2
    except psycopg2.OperationalError as err:
        error(f"replayable: lost the database: {redact(str(err), dsn)}")
        return 2
    except airflow_http.AirflowRefusedError as err:
        error(f"replayable: Airflow refused: {err.status} {err.detail}")
        return 2
    except KeyboardInterrupt:
        return 130
