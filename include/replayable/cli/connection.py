"""Which database the command reads, and a read-only session on it.

The address comes from ``--dsn``, else ``$REPLAYABLE_DATABASE_URL`` (read by
:mod:`replayable.config`), else Airflow's ledger connection. A driver error may quote the
address or its password, so every message shown from one goes through :func:`redact`.
"""

from __future__ import annotations

import contextlib
import re
from urllib.parse import urlparse

import psycopg2

from replayable import config, db
from replayable.cli.errors import UsageError
from replayable.vocabulary import DATABASE_URL_ENV, LEDGER_CONN_ID


def resolve_dsn(explicit: str | None) -> str:
    """The DSN to use: ``--dsn``, else ``$REPLAYABLE_DATABASE_URL``, else Airflow's connection.

    The last is ``replayable_db`` as Airflow resolves it (an ``AIRFLOW_CONN_REPLAYABLE_DB``
    variable, a secrets backend or the metadata database), so on an Airflow host the CLI
    reads the ledger the DAGs write without being told where it is.
    """
    if explicit:
        return explicit
    from_env = config.database_url()
    if from_env:
        return from_env
    try:
        # Imported here: hooks load Airflow, which only this fallback needs.
        from replayable.airflow.hooks import connection_dsn

        return connection_dsn(LEDGER_CONN_ID)
    # Not found, or no Airflow configured here: a message, not a traceback.
    except Exception as err:
        raise UsageError(
            f"no database given ({_lookup_failure(err)}): set {DATABASE_URL_ENV} (or pass "
            f"--dsn), or define Airflow's {LEDGER_CONN_ID} connection; in a source checkout, "
            "`make start` starts a local one and `make env` prints the exports"
        ) from err


def _lookup_failure(err: Exception) -> str:
    """Why Airflow gave no ledger connection, without quoting it: it may hold a password."""
    if type(err).__name__ == "AirflowNotFoundException":
        # Airflow reports a variable it cannot parse as a connection that is not defined.
        if config.airflow_connection_variable(LEDGER_CONN_ID) is not None:
            variable = config.airflow_connection_env(LEDGER_CONN_ID)
            return f"{variable} is set, but Airflow could not read a connection from it"
        return f"Airflow has no {LEDGER_CONN_ID} connection"
    return f"reading Airflow's {LEDGER_CONN_ID} connection failed: {type(err).__name__}"


def connect(dsn: str) -> db.Connection:
    """A read-only, autocommit session on ``dsn``; a :class:`UsageError` saying why not."""
    try:
        conn = db.connect(dsn)
    except psycopg2.ProgrammingError as err:  # libpq could not parse it
        raise UsageError(f"the database DSN is not valid: {redact(str(err), dsn)}") from err
    except psycopg2.Error as err:
        raise UsageError(
            f"cannot connect to the database: {redact(str(err), dsn)}\n"
            f"Is it running, and does {DATABASE_URL_ENV} (or --dsn, or the connection) name it?"
        ) from err
    conn.set_session(readonly=True, autocommit=True)
    return conn


def redact(message: str, dsn: str) -> str:
    """``message`` without the DSN or its password: driver errors may quote either."""
    secrets = {dsn.strip(), *re.findall(r"password\s*=\s*'?([^'\s]+)", dsn)}
    if "://" in dsn:
        with contextlib.suppress(ValueError):  # a malformed URI has no password to hide
            secrets.add(urlparse(dsn).password or "")
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        message = message.replace(secret, "***")
    return message.strip()
