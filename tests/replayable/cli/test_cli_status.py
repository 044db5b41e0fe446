"""``replayable status``: counts per stage, a run's own documents, and --watch."""

import json

import pytest
from cli_ledger import EMBED_MODEL, A, by_stage, fill_ledger, run_json

from replayable import db
from replayable.cli import main


@pytest.fixture
def ledger(conn):
    """A, B and C in a few stages and runs: r1 touched A and B, r2 touched C."""
    fill_ledger(conn)


def test_status_counts_the_current_row_per_document_and_stage(ledger, dsn, capsys):
    data = run_json(capsys, dsn, "status")
    stages = by_stage(data)
    assert {k: stages["extract"][k] for k in ("done", "failed", "dead", "total")} == {
        "done": 1,
        "failed": 1,
        "dead": 1,
        "total": 3,
    }
    assert stages["chunk"]["running"] == 1
    assert stages["extract"]["open_dead_letters"] == 1
    assert data["model_calls"] == {"calls": 3, "ok": 2, "tokens": 150}
    assert data["open_dead_letters"] == 1
    assert data["finished"] is False


def test_status_table_shows_progress_as_done_and_dead_of_total(ledger, dsn, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["--dsn", dsn, "status"]) == 0
    out = capsys.readouterr().out
    assert "2/3 67%" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_status_run_filters_to_the_documents_and_calls_of_that_run(ledger, dsn, capsys):
    data = run_json(capsys, dsn, "status", "--run", "r1")
    extract = by_stage(data)["extract"]
    assert (extract["done"], extract["failed"], extract["dead"], extract["total"]) == (1, 1, 0, 2)
    assert data["open_dead_letters"] == 0
    assert data["model_calls"] == {"calls": 2, "ok": 1, "tokens": 100}


def test_status_shows_what_the_model_calls_cost_by_model(ledger, dsn, capsys, monkeypatch):
    """The last 30 days for all runs, a run's own calls with --run; a model with no price
    is counted as unpriced, not as free (ADR 0110)."""
    data = run_json(capsys, dsn, "status")
    assert (data["cost"]["usd"], data["cost"]["unpriced_calls"], data["cost_days"]) == (
        pytest.approx(0.000002),
        1,
        30,
    )
    assert [(m["model"], m["calls"], m["unpriced_calls"]) for m in data["cost"]["by_model"]] == [
        (EMBED_MODEL, 1, 0),
        ("unpriced-model", 1, 1),
    ]
    run = run_json(capsys, dsn, "status", "--run", "r1")["cost"]
    assert (run["usd"], run["unpriced_calls"]) == (pytest.approx(0.000002), 0)
    monkeypatch.setenv("COLUMNS", "120")
    assert main(["--dsn", dsn, "status"]) == 0
    out = capsys.readouterr().out
    assert "Model cost (last 30 days" in out
    assert "$0.000002" in out


def _report(conn, run_id):
    """The run's report, as its report task writes it at the end of the run."""
    db.execute(conn, "report/save_report", {"dag_id": "d", "run_id": run_id, "report": "{}"})
    conn.commit()


def test_status_watch_returns_once_the_run_has_written_its_report(ledger, conn, dsn, capsys):
    _report(conn, "r2")
    assert main(["--dsn", dsn, "status", "--run", "r2", "--watch", "5"]) == 0
    assert "Items by stage (run r2)" in capsys.readouterr().out


def test_status_watch_keeps_watching_a_run_with_nothing_running_until_its_report(
    ledger, conn, dsn, capsys
):
    """Between two batches nothing of the run may be running: that is no end of the run."""
    args = ["--dsn", dsn, "--json", "status", "--run", "r2", "--watch", "0.05", "--timeout", "0.3"]
    assert main(args) == 1
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["in_progress"] == 0 and first["items"] > 0 and first["finished"] is False


def test_status_watch_follows_the_newest_run_when_none_is_named(ledger, conn, dsn, capsys):
    with conn.cursor() as cur:
        # r1 becomes the newest run by making the others older (its report stays later).
        cur.execute("UPDATE replayable.runs SET created_at = now() - interval '1 minute'"
                    " WHERE run_id <> 'r1'")  # fmt: skip
    conn.commit()
    _report(conn, "r1")
    args = ["--dsn", dsn, "--json", "status", "--watch", "0.05", "--timeout", "10"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["run_id"] == "r1"


def test_status_watch_without_any_run_exits_2(conn, dsn, capsys):
    assert main(["--dsn", dsn, "status", "--watch", "1"]) == 2
    assert "no run" in capsys.readouterr().err


def test_status_watch_gives_up_with_1_after_the_timeout(ledger, dsn, capsys):
    args = ["--dsn", dsn, "--json", "status", "--run", "r1", "--watch", "0.05", "--timeout", "0.2"]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) >= 2  # one JSON line per poll
    assert "timed out" in captured.err


def test_status_prints_no_escape_sequence_from_a_stage_name(conn, dsn, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES (%s, 'u', 1)", (A,)
        )
        cur.execute(
            "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
            " code_version, config_hash, is_current)"
            " VALUES ('x\x1b]52;c;ZXZpbA==\x07', 'k', %s, 'done', 1, '1', 'c', true)",
            (A,),
        )
    conn.commit()
    assert main(["--dsn", dsn, "status"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "x\ufffd" in out
