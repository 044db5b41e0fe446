"""The command as a whole: where it finds the database, --json anywhere, exit codes."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_ledger import fill_ledger, run_json

from devtools import devenv
from replayable import config
from replayable.cli import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def ledger(conn):
    """A, B and C in a few stages and runs: r1 touched A and B, r2 touched C."""
    fill_ledger(conn)


def test_json_works_before_or_after_the_command(ledger, dsn, capsys):
    assert main(["failed", "--json", "--dsn", dsn]) == 0
    after = json.loads(capsys.readouterr().out)
    assert run_json(capsys, dsn, "failed") == after
    assert after["matched"] == 2


def test_without_a_database_it_exits_2_saying_how_to_get_one(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(config.DATABASE_URL_ENV, raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_REPLAYABLE_DB", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert config.DATABASE_URL_ENV in err and "replayable_db" in err and "make env" in err
    assert "Airflow has no replayable_db connection" in err


def test_a_broken_ledger_connection_is_named_as_the_reason_without_its_password(
    monkeypatch, tmp_path, capsys
):
    """A connection Airflow cannot read is not reported as a missing one."""
    monkeypatch.delenv(config.DATABASE_URL_ENV, raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv(
        "AIRFLOW_CONN_REPLAYABLE_DB", '{"conn_type": "postgres", "password": "s3cret"'
    )
    assert main(["status"]) == 2
    err = capsys.readouterr().err
    assert "AIRFLOW_CONN_REPLAYABLE_DB is set, but Airflow could not read a connection" in err
    assert "Airflow has no" not in err and "s3cret" not in err


def test_without_a_url_it_reads_airflows_ledger_connection(monkeypatch, dsn, capsys):
    """On an Airflow host the CLI finds the ledger through the connection the DAGs use."""
    monkeypatch.delenv(config.DATABASE_URL_ENV, raising=False)
    # The connection exactly as `make env` and the DAGs' Airflow get it.
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_DB", devenv.postgres_conn_json(dsn))
    assert main(["status", "--json"]) == 0
    assert "stages" in json.loads(capsys.readouterr().out)


def test_a_connection_failure_exits_2_without_printing_the_password(capsys):
    assert main(["--dsn", "postgresql://bob:s3cret@127.0.0.1:1/x", "status"]) == 2
    captured = capsys.readouterr()
    assert "cannot connect" in captured.err
    assert "s3cret" not in captured.err + captured.out


def test_python_m_replayable_runs_the_cli(ledger, dsn):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "include"), "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-m", "replayable", "--dsn", dsn, "status"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "Items by stage (all runs)" in done.stdout


def _queries_run_in(path: Path) -> list[str]:
    """The query names ``path`` hands to ``db.fetch_all``, ``db.execute`` or ``db.sql``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        position = {"fetch_all": 1, "execute": 1, "sql": 0}.get(node.func.attr)
        if position is None or len(node.args) <= position:
            continue
        name = node.args[position]
        found.append(name.value if isinstance(name, ast.Constant) else f"<{ast.unparse(name)}>")
    return found


def _queries_by_module(package: Path) -> dict[str, list[str]]:
    return {
        str(path.relative_to(package)): names
        for path in sorted(package.rglob("*.py"))
        if (names := _queries_run_in(path))
    }


def test_the_cli_reads_the_ledger_only_through_views():
    """Its one query of its own is the outbox requeue, the command's one write (ADR 0093);
    what it prints comes from the read layer, which runs no query of its own (ADR 0159)."""
    assert _queries_by_module(ROOT / "include" / "replayable" / "cli") == {
        "commands/outbox.py": ["outbox/requeue"],
    }
    # rerun prints the text of the count query that views runs.
    assert _queries_by_module(ROOT / "include" / "replayable" / "read") == {
        "runs.py": ["<views.RERUN_COUNT>"],
    }
