"""``replayable rerun``: a valid conf, its query, and the documents it matches now."""

import copy
import json
import shlex
from datetime import UTC, datetime, timedelta

import pytest
from cli_ledger import A, fill_ledger, run_json

from replayable import db
from replayable.airflow.params import STATUSES, pipeline_params
from replayable.cli import arguments, main
from replayable.pipeline import select_documents
from replayable.settings import PipelineSettings
from replayable.vocabulary import ITEM_STATUSES


@pytest.fixture
def ledger(conn):
    """A, B and C in a few stages and runs: r1 touched A and B, r2 touched C."""
    fill_ledger(conn)


def test_rerun_prints_a_valid_conf_the_sql_and_the_matching_count(
    ledger, conn, dsn, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "200")
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    args = ["rerun", "--stage", "extract", "--status", "failed", "dead"]
    args += ["--code-version-lt", "1.10", "--since", since]
    assert main(["--dsn", dsn, *args]) == 0
    out = capsys.readouterr().out

    trigger = next(line for line in out.splitlines() if line.startswith("airflow dags trigger"))
    conf = json.loads(shlex.split(trigger)[-1])
    assert set(conf) == {"rerun"}
    param = copy.deepcopy(pipeline_params("/data")["rerun"])
    assert param.resolve(conf["rerun"]) == conf["rerun"]
    assert "error_class" not in conf["rerun"]
    assert "make " not in out, "the installed command never points at a source checkout"

    for line in db.sql("plan/count_rerun_docs").splitlines():
        assert line.strip() in out
    settings = PipelineSettings(rerun=conf["rerun"])
    matching = select_documents(conn, settings, dag_id="d", run_id="rerun")
    # Current state: A's extract failed once under 1.0 but is done under 1.1 now.
    assert matching == 2
    assert "Documents matching now: 2" in out


def test_rerun_resolves_a_doc_id_prefix_to_the_full_id(ledger, dsn, capsys):
    data = run_json(capsys, dsn, "rerun", "--stage", "embed", "--doc-id", A[:12])
    assert data["conf"] == {"rerun": {"stage": "embed", "doc_ids": [A]}}
    assert data["params"]["doc_ids"] == [A] and data["params"]["statuses"] is None
    assert data["matching_documents"] == 1


def test_rerun_with_an_unknown_doc_id_prefix_exits_2(ledger, dsn, capsys):
    assert main(["--dsn", dsn, "rerun", "--stage", "embed", "--doc-id", "abcdef"]) == 2
    assert "--doc-id" in capsys.readouterr().err


def test_rerun_with_a_bad_code_version_exits_2_naming_the_flag(dsn, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--dsn", dsn, "rerun", "--stage", "extract", "--code-version-lt", "1.x"])
    assert exit_.value.code == 2
    assert "--code-version-lt" in capsys.readouterr().err


def test_statuses_and_version_pattern_agree_with_the_dag_params():
    rerun = pipeline_params("/data")["rerun"].schema["properties"]
    assert ITEM_STATUSES == STATUSES
    assert rerun["code_version_lt"]["pattern"] == arguments.VERSION_PATTERN
