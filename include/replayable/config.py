"""Every ``[replayable]`` Airflow option and environment variable the product reads, read here.

Each setting is one small typed function that reads its value when called, so a changed
environment or ``airflow.cfg`` is seen by the next call, as Airflow's own ``conf.get`` sees it.
Airflow's configuration is imported inside the functions that read it: the ``replayable``
command and the core import this module without loading Airflow, which costs seconds.

What the names mean (stages, statuses, DAG and connection ids) lives in
:mod:`replayable.vocabulary`; this module only says where a deployment sets a value.
"""

from __future__ import annotations

import os

from replayable.vocabulary import DATABASE_URL_ENV

__all__ = [
    "AIRFLOW_PASSWORD_ENV",
    "AIRFLOW_TOKEN_ENV",
    "AIRFLOW_URL_ENV",
    "AIRFLOW_USERNAME_ENV",
    "DATABASE_URL_ENV",
    "DEFAULT_AIRFLOW_URL",
    "DEFAULT_MAX_MAP_LENGTH",
    "DEFAULT_SEARCHES_PER_USER_PER_MINUTE",
    "DEFAULT_UI_POOL_SIZE",
    "DEFAULT_UI_STATEMENT_TIMEOUT_S",
    "SECTION",
    "SOURCE_ROOTS_ENV",
    "airflow_api_url",
    "airflow_connection_env",
    "airflow_connection_variable",
    "airflow_password",
    "airflow_token",
    "airflow_url",
    "airflow_username",
    "api_base_url",
    "api_serves_https",
    "database_url",
    "listed_source_roots",
    "max_map_length",
    "multi_team",
    "queue_for_cores",
    "searches_per_user_per_minute",
    "sweeper_poke_interval_s",
    "ui_pool_size",
    "ui_statement_timeout_s",
]

# The airflow.cfg section (or AIRFLOW__REPLAYABLE__* variables) of this package's options.
SECTION = "replayable"

# ---- environment variables ---------------------------------------------------------------

# Folders beyond data/ that a run's `source` may read (ADR 0012), os.pathsep-separated.
SOURCE_ROOTS_ENV = "REPLAYABLE_SOURCE_ROOTS"
# Where `replayable redrive --trigger` reaches Airflow, and as whom (ADR 0064). No password
# flag exists: a command line is visible to every user of the machine and stays in history.
AIRFLOW_URL_ENV = "AIRFLOW_URL"
AIRFLOW_TOKEN_ENV = "AIRFLOW_TOKEN"  # noqa: S105 - the variable's name, not a token
AIRFLOW_USERNAME_ENV = "AIRFLOW_USERNAME"
AIRFLOW_PASSWORD_ENV = "AIRFLOW_PASSWORD"  # noqa: S105 - the variable's name
DEFAULT_AIRFLOW_URL = "http://127.0.0.1:8080"  # `make airflow`


def _env(name: str) -> str | None:
    """The variable's value; None when unset or empty, which every reader treats alike."""
    return os.environ.get(name) or None


def airflow_connection_env(conn_id: str) -> str:
    """The name of the variable Airflow reads the connection ``conn_id`` from."""
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def airflow_connection_variable(conn_id: str) -> str | None:
    """The value of ``airflow_connection_env(conn_id)``; None when unset or empty."""
    return _env(airflow_connection_env(conn_id))


def database_url() -> str | None:
    """The ledger's libpq URI from ``$REPLAYABLE_DATABASE_URL``, or None when unset."""
    return _env(DATABASE_URL_ENV)


def listed_source_roots() -> str:
    """``$REPLAYABLE_SOURCE_ROOTS`` as written (``os.pathsep``-separated), or ``""``."""
    return os.environ.get(SOURCE_ROOTS_ENV, "")


def airflow_url() -> str:
    """The Airflow the CLI triggers runs on: ``$AIRFLOW_URL``, else the local dev server."""
    return _env(AIRFLOW_URL_ENV) or DEFAULT_AIRFLOW_URL


def airflow_username() -> str | None:
    """The Airflow user the CLI logs in as, from ``$AIRFLOW_USERNAME``."""
    return _env(AIRFLOW_USERNAME_ENV)


def airflow_password() -> str | None:
    """That user's password from ``$AIRFLOW_PASSWORD``; None (not blank) means ask."""
    # An empty password is a password: only an unset variable means "prompt".
    return os.environ.get(AIRFLOW_PASSWORD_ENV)


def airflow_token() -> str | None:
    """An Airflow JWT from ``$AIRFLOW_TOKEN``, used when no username is given."""
    return _env(AIRFLOW_TOKEN_ENV)


# ---- Airflow options -----------------------------------------------------------------------

DEFAULT_UI_POOL_SIZE = 4
DEFAULT_UI_STATEMENT_TIMEOUT_S = 5.0
DEFAULT_SWEEPER_POKE_INTERVAL_S = 30.0
DEFAULT_SEARCHES_PER_USER_PER_MINUTE = 30
# Airflow's own default of [core] max_map_length.
DEFAULT_MAX_MAP_LENGTH = 1024


def batch_slots() -> int:
    """Stage tasks that can run at once, which ``batch_size: "auto"`` sizes batches for.

    ``[replayable] batch_slots`` when set (at least 1), for a cluster whose workers the
    planner cannot see; else the smaller of ``[core] parallelism`` and the planner's cores.
    One extract task already keeps a guarded worker busy on every core, so on one machine
    more slots than cores only queue for CPU (ADR 0104).
    """
    from airflow.configuration import conf

    configured = conf.get(SECTION, "batch_slots", fallback="").strip()
    if configured:
        try:
            slots = int(configured)
        except ValueError:
            slots = 0
        if slots < 1:
            raise ValueError(
                f"[replayable] batch_slots must be a whole number of at least 1, got {configured!r}"
            )
        return slots
    cores = os.cpu_count() or 1
    parallelism = conf.getint("core", "parallelism", fallback=cores)
    return min(parallelism, cores) if parallelism > 0 else cores


def queue_for_cores() -> bool:
    """``[replayable] queue_for_cores`` (default true): a batch extracting on every core of
    its machine waits for the other extractions there to end, and they for it (ADR 0123)."""
    from airflow.configuration import conf

    return conf.getboolean(SECTION, "queue_for_cores", fallback=True)


def ui_pool_size() -> int:
    """``[replayable] ui_pool_size``: the UI's most database connections (ADR 0015)."""
    from airflow.configuration import conf

    return conf.getint(SECTION, "ui_pool_size", fallback=DEFAULT_UI_POOL_SIZE)


def ui_statement_timeout_s() -> float:
    """``[replayable] ui_statement_timeout_s``: when a UI statement is cancelled (ADR 0015)."""
    from airflow.configuration import conf

    return conf.getfloat(SECTION, "ui_statement_timeout_s", fallback=DEFAULT_UI_STATEMENT_TIMEOUT_S)


def sweeper_poke_interval_s() -> float:
    """``[replayable] sweeper_poke_interval_s``: how often a sweep checks its re-run's end.

    Read when the sweeper DAG is parsed; it is the deferred trigger's poke interval, so a
    value of 0 or less, which would make the triggerer poll without pause, is refused.
    """
    from airflow.configuration import conf

    value = conf.getfloat(
        SECTION, "sweeper_poke_interval_s", fallback=DEFAULT_SWEEPER_POKE_INTERVAL_S
    )
    if not value > 0:
        raise ValueError(f"[{SECTION}] sweeper_poke_interval_s must be > 0, got {value}")
    return value


def searches_per_user_per_minute() -> int:
    """``[replayable] searches_per_user_per_minute`` (30): the most searches one user makes
    in the UI and its API in a minute, whichever API server answers them (ADR 0153)."""
    from airflow.configuration import conf

    value = conf.getint(
        SECTION, "searches_per_user_per_minute", fallback=DEFAULT_SEARCHES_PER_USER_PER_MINUTE
    )
    if value < 1:
        raise ValueError(
            f"[{SECTION}] searches_per_user_per_minute must be at least 1, got {value}"
        )
    return value


def api_base_url() -> str | None:
    """Airflow's ``[api] base_url``, or None when it is not set."""
    from airflow.configuration import conf

    return conf.get("api", "base_url", fallback=None) or None


def airflow_api_url() -> str | None:
    """Where the UI reaches Airflow's REST API as configured (ADR 0062).

    ``[replayable] airflow_api_url``, else ``[api] base_url``; None when neither is set, and
    the caller falls back to the address its request arrived at.
    """
    from airflow.configuration import conf

    return conf.get(SECTION, "airflow_api_url", fallback=None) or api_base_url()


def api_serves_https() -> bool:
    """Whether Airflow's API server has a TLS certificate (``[api] ssl_cert``)."""
    from airflow.configuration import conf

    return bool(conf.get("api", "ssl_cert", fallback=""))


def multi_team() -> bool:
    """Airflow's ``[core] multi_team``: whether DAGs belong to teams."""
    from airflow.configuration import conf

    return conf.getboolean("core", "multi_team", fallback=False)


def max_map_length() -> int:
    """Airflow's ``[core] max_map_length``: the most mapped task instances one task may have."""
    from airflow.configuration import conf

    return conf.getint("core", "max_map_length", fallback=DEFAULT_MAX_MAP_LENGTH)
