"""Every option and environment variable is read in config.py, with its documented fallback."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from replayable import config, sources

PACKAGE = Path(config.__file__).parent
# What reads settings: os.environ / os.getenv, and Airflow's configuration object.
_READERS = ("environ", "getenv")


def test_the_cli_environment_variables_are_read_with_their_fallbacks(monkeypatch):
    """Unset or empty variables read as None (the URL as the local dev server)."""
    for name in (
        config.DATABASE_URL_ENV,
        config.AIRFLOW_URL_ENV,
        config.AIRFLOW_TOKEN_ENV,
        config.AIRFLOW_USERNAME_ENV,
        config.AIRFLOW_PASSWORD_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    assert config.database_url() is None
    assert config.airflow_url() == config.DEFAULT_AIRFLOW_URL
    assert config.airflow_token() is None and config.airflow_username() is None
    assert config.airflow_password() is None
    monkeypatch.setenv(config.DATABASE_URL_ENV, "postgresql://h/db")
    monkeypatch.setenv(config.AIRFLOW_URL_ENV, "")
    monkeypatch.setenv(config.AIRFLOW_TOKEN_ENV, "jwt")
    monkeypatch.setenv(config.AIRFLOW_USERNAME_ENV, "ada")
    monkeypatch.setenv(config.AIRFLOW_PASSWORD_ENV, "")
    assert config.database_url() == "postgresql://h/db"
    assert config.airflow_url() == config.DEFAULT_AIRFLOW_URL
    assert (config.airflow_token(), config.airflow_username()) == ("jwt", "ada")
    # An empty password is a password: only an unset variable means "ask at the terminal".
    assert config.airflow_password() == ""
    monkeypatch.delenv("AIRFLOW_CONN_REPLAYABLE_DB", raising=False)
    assert config.airflow_connection_env("replayable_db") == "AIRFLOW_CONN_REPLAYABLE_DB"
    assert config.airflow_connection_variable("replayable_db") is None
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_DB", "postgresql://h/db")
    assert config.airflow_connection_variable("replayable_db") == "postgresql://h/db"


def test_the_source_roots_variable_feeds_the_allowed_roots(monkeypatch, tmp_path):
    monkeypatch.setenv(config.SOURCE_ROOTS_ENV, str(tmp_path))
    assert config.listed_source_roots() == str(tmp_path)
    assert str(tmp_path.resolve()) in sources.allowed_roots()
    monkeypatch.delenv(config.SOURCE_ROOTS_ENV)
    assert config.listed_source_roots() == ""
    assert str(tmp_path.resolve()) not in sources.allowed_roots()


def test_airflow_options_have_their_documented_defaults(monkeypatch):
    for name in (
        "AIRFLOW__REPLAYABLE__UI_POOL_SIZE",
        "AIRFLOW__REPLAYABLE__UI_STATEMENT_TIMEOUT_S",
        "AIRFLOW__REPLAYABLE__AIRFLOW_API_URL",
        "AIRFLOW__API__BASE_URL",
        "AIRFLOW__API__SSL_CERT",
        "AIRFLOW__CORE__MULTI_TEAM",
        "AIRFLOW__CORE__MAX_MAP_LENGTH",
        "AIRFLOW__REPLAYABLE__SWEEPER_POKE_INTERVAL_S",
        "AIRFLOW__REPLAYABLE__SEARCHES_PER_USER_PER_MINUTE",
    ):
        monkeypatch.delenv(name, raising=False)
    assert config.sweeper_poke_interval_s() == 30.0
    assert config.searches_per_user_per_minute() == 30
    assert config.ui_pool_size() == 4
    assert config.ui_statement_timeout_s() == 5.0
    assert config.max_map_length() == 1024
    assert config.multi_team() is False


def test_airflow_options_are_read_when_called(monkeypatch):
    """A value set as AIRFLOW__SECTION__KEY is seen by the next call."""
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__UI_POOL_SIZE", "9")
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__UI_STATEMENT_TIMEOUT_S", "0.5")
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "7")
    monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "True")
    monkeypatch.setenv("AIRFLOW__API__SSL_CERT", "/cert.pem")
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__SWEEPER_POKE_INTERVAL_S", "2")
    assert config.sweeper_poke_interval_s() == 2.0
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__SWEEPER_POKE_INTERVAL_S", "0")
    with pytest.raises(ValueError, match="sweeper_poke_interval_s must be > 0"):
        config.sweeper_poke_interval_s()
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__SWEEPER_POKE_INTERVAL_S", "2")
    assert config.ui_pool_size() == 9
    assert config.ui_statement_timeout_s() == 0.5
    assert config.max_map_length() == 7
    assert config.multi_team() is True
    assert config.api_serves_https() is True


def test_the_searches_per_user_per_minute_are_a_whole_number_of_at_least_one(monkeypatch):
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__SEARCHES_PER_USER_PER_MINUTE", "3")
    assert config.searches_per_user_per_minute() == 3
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__SEARCHES_PER_USER_PER_MINUTE", "0")
    with pytest.raises(ValueError, match="searches_per_user_per_minute must be at least 1"):
        config.searches_per_user_per_minute()


def test_batch_slots_are_the_smaller_of_parallelism_and_cores_unless_set(monkeypatch):
    monkeypatch.delenv("AIRFLOW__REPLAYABLE__BATCH_SLOTS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setenv("AIRFLOW__CORE__PARALLELISM", "32")
    assert config.batch_slots() == 8
    monkeypatch.setenv("AIRFLOW__CORE__PARALLELISM", "3")
    assert config.batch_slots() == 3
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__BATCH_SLOTS", "40")
    assert config.batch_slots() == 40
    for bad in ("0", "many"):
        monkeypatch.setenv("AIRFLOW__REPLAYABLE__BATCH_SLOTS", bad)
        with pytest.raises(ValueError, match=r"\[replayable\] batch_slots must be"):
            config.batch_slots()


def test_extractions_queue_for_the_cores_unless_turned_off(monkeypatch):
    monkeypatch.delenv("AIRFLOW__REPLAYABLE__QUEUE_FOR_CORES", raising=False)
    assert config.queue_for_cores() is True
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__QUEUE_FOR_CORES", "False")
    assert config.queue_for_cores() is False


def test_the_ui_reaches_airflow_at_its_own_option_else_the_api_base_url(monkeypatch):
    monkeypatch.delenv("AIRFLOW__REPLAYABLE__AIRFLOW_API_URL", raising=False)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    assert config.airflow_api_url() is None and config.api_base_url() is None
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://base:8080")
    assert config.airflow_api_url() == config.api_base_url() == "http://base:8080"
    monkeypatch.setenv("AIRFLOW__REPLAYABLE__AIRFLOW_API_URL", "http://own:9000")
    assert config.airflow_api_url() == "http://own:9000"


def test_importing_config_does_not_load_airflow():
    """The CLI imports config on every command; loading Airflow would cost seconds."""
    probe = "import sys, replayable.config; print('airflow' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def _settings_readers(path: Path) -> list[int]:
    """Lines of ``path`` that touch os.environ / os.getenv or import Airflow's configuration."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if (isinstance(node, ast.Attribute) and node.attr in _READERS) or (
            isinstance(node, ast.ImportFrom) and node.module == "airflow.configuration"
        ):
            found.append(node.lineno)
    return found


def test_no_other_module_reads_the_environment_or_airflow_options():
    readers = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "config.py" and (lines := _settings_readers(path))
    }
    assert not readers, f"read settings through replayable.config: {readers}"


def test_the_settings_walk_finds_a_reader(tmp_path):
    """The walk itself sees an environment read, so an empty result means clean."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nfrom airflow.configuration import conf\nos.environ.get('X')\n")
    assert _settings_readers(probe) == [2, 3]
