"""``replayable check``: each violation printed with its stage, document and item; exit 1."""

from __future__ import annotations

import json

import pytest

from invariant_ledger import A, B, fill_clean_ledger, run_sql
from replayable import invariants
from replayable.cli import main

pytestmark = pytest.mark.db


@pytest.fixture
def ledger(conn):
    return fill_clean_ledger(conn)


def test_a_clean_ledger_exits_0_and_says_so(ledger, dsn, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["--dsn", dsn, "check", "--quiescent"]) == 0
    out = capsys.readouterr().out
    assert "no violation" in out and "dead_without_letter" in out


def test_a_violation_exits_1_and_names_its_stage_document_and_item(ledger, dsn, capsys):
    run_sql(ledger, "UPDATE replayable.dead_letters SET status = 'redriven' WHERE doc_id = %s", B)
    assert main(["--dsn", dsn, "--json", "check"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["clean"] is False and data["totals"]["dead_without_letter"] == 1
    [violation] = data["violations"]
    assert violation["invariant"] == "dead_without_letter"
    assert (violation["stage"], violation["doc_id"], violation["item_key"]) == (
        "embed",
        B,
        "embed-b",
    )


def test_the_table_is_terminal_safe(ledger, dsn, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    run_sql(
        ledger,
        "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class, error_kind,"
        " error, attempts, code_version) VALUES ('embed', 'old', %s,"
        " E'\\x1b[2Jevil\\x07', 'terminal', 'e', 1, '1.0')",
        A,
    )
    assert main(["--dsn", dsn, "check"]) == 1
    out = capsys.readouterr().out
    assert "done_with_open_letter" in out and "embed" in out and "aaaaaaaaaaaa" in out
    assert "\x1b[2J" not in out and "\x07" not in out


def test_a_stale_lease_is_in_flight_until_quiescence(ledger, dsn, capsys):
    run_sql(
        ledger,
        "UPDATE replayable.stage_runs SET status = 'running', lease_owner = 'w',"
        " lease_expires = now() - interval '1 minute' WHERE item_key = 'summarize-a'",
    )
    assert main(["--dsn", dsn, "--json", "check"]) == 0
    assert json.loads(capsys.readouterr().out)["in_flight_total"] == 1
    assert main(["--dsn", dsn, "--json", "check", "--quiescent"]) == 1
    assert json.loads(capsys.readouterr().out)["totals"]["no_outcome"] == 1


def test_record_keeps_the_counts_for_the_metrics(ledger, dsn, capsys):
    run_sql(ledger, "UPDATE replayable.dead_letters SET status = 'redriven'")
    assert main(["--dsn", dsn, "--json", "check", "--record", "--limit", "1"]) == 1
    assert len(json.loads(capsys.readouterr().out)["violations"]) == 1
    counts = {r["invariant"]: r["violations"] for r in invariants.recorded_counts(ledger)}
    assert counts["dead_without_letter"] == 2 and counts["one_current_item"] == 0
