import copy
import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from devtools import devenv
from fake_airflow import PASSWORD, TOKEN, USERNAME, FakeAirflow
from replayable import cli, db
from replayable.params import STATUSES, pipeline_params
from replayable.pipeline import select_documents
from replayable.settings import PipelineSettings

ROOT = Path(__file__).resolve().parents[2]
A, B, C = "a" * 64, "b" * 64, "c" * 64


def _insert(conn, sql, rows):
    with conn.cursor() as cur:
        for row in rows:
            cur.execute(sql, row)


@pytest.fixture
def ledger(conn):
    """A, B and C in a few stages and runs: r1 touched A and B, r2 touched C."""
    _insert(
        conn,
        "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES (%s, %s, 10)",
        [(A, "/data/a.pdf"), (B, "/data/b.pdf"), (C, "/data/c.pdf")],
    )
    _insert(
        conn,
        "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
        " error_class, last_error, code_version, config_hash, run_id, is_current, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'cfg', %s, %s,"
        " now() - make_interval(mins => %s))",
        [
            # A's older extract row failed; its newer one is done and is the current one.
            ("extract", "ea-old", A, "failed", 1, "http_503", "old", "1.0", "r1", False, 120),
            ("extract", "ea", A, "done", 1, None, None, "1.1", "r1", True, 60),
            ("extract", "eb", B, "failed", 1, "http_503", "503 upstream", "1.1", "r1", True, 30),
            ("extract", "ec", C, "dead", 3, "encrypted", "locked", "1.1", "r2", True, 10),
            ("chunk", "ca", A, "running", 1, None, None, "1.1", "r1", True, 5),
            ("embed", "ma", A, "failed", 2, "http_429", "429 [slow] down", "2.0", "r1", True, 1),
        ],
    )
    _insert(
        conn,
        "INSERT INTO replayable.runs (dag_id, run_id, documents) VALUES ('d', %s, %s)",
        [("r1", 2), ("r2", 1)],
    )
    _insert(
        conn,
        "INSERT INTO replayable.run_docs (dag_id, run_id, doc_id) VALUES ('d', %s, %s)",
        [("r1", A), ("r1", B), ("r2", C)],
    )
    _insert(
        conn,
        "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class, error_kind,"
        " error, attempts, code_version, run_id, map_index, status, owner)"
        " VALUES (%s, %s, %s, %s, 'terminal', 'boom', 3, %s, %s, %s, %s, %s)",
        [
            ("extract", "ec", C, "encrypted", "1.1", "r2", 0, "open", "alice"),
            ("embed", "m-old", A, "http_500", "1.0", "r1", 1, "redriven", None),
        ],
    )
    _insert(
        conn,
        "INSERT INTO replayable.model_calls (stage, item_key, attempt, status, latency_ms,"
        " n_inputs, tokens, idempotency_key, run_id)"
        " VALUES ('embed', %s, 1, %s, 5, 1, %s, 'k', %s)",
        [("ma", "ok", 100, "r1"), ("ma", "http_429", 0, "r1"), ("other", "ok", 50, "r2")],
    )
    conn.commit()


def run_json(capsys, dsn, *args):
    assert cli.main(["--dsn", dsn, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def by_stage(data):
    return {s["stage"]: s for s in data["stages"]}


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
    assert cli.main(["--dsn", dsn, "status"]) == 0
    out = capsys.readouterr().out
    assert "2/3 67%" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_status_run_filters_to_the_documents_and_calls_of_that_run(ledger, dsn, capsys):
    data = run_json(capsys, dsn, "status", "--run", "r1")
    extract = by_stage(data)["extract"]
    assert (extract["done"], extract["failed"], extract["dead"], extract["total"]) == (1, 1, 0, 2)
    assert data["open_dead_letters"] == 0
    assert data["model_calls"] == {"calls": 2, "ok": 1, "tokens": 100}


def _report(conn, run_id):
    """The run's report, as its report task writes it at the end of the run."""
    db.execute(conn, "report/save_report", {"dag_id": "d", "run_id": run_id, "report": "{}"})
    conn.commit()


def test_status_watch_returns_once_the_run_has_written_its_report(ledger, conn, dsn, capsys):
    _report(conn, "r2")
    assert cli.main(["--dsn", dsn, "status", "--run", "r2", "--watch", "5"]) == 0
    assert "Items by stage (run r2)" in capsys.readouterr().out


def test_status_watch_keeps_watching_a_run_with_nothing_running_until_its_report(
    ledger, conn, dsn, capsys
):
    """Between two batches nothing of the run may be running: that is no end of the run."""
    args = ["--dsn", dsn, "--json", "status", "--run", "r2", "--watch", "0.05", "--timeout", "0.3"]
    assert cli.main(args) == 1
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
    assert cli.main(args) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["run_id"] == "r1"


def test_status_watch_without_any_run_exits_2(conn, dsn, capsys):
    assert cli.main(["--dsn", dsn, "status", "--watch", "1"]) == 2
    assert "no run" in capsys.readouterr().err


def test_status_watch_gives_up_with_1_after_the_timeout(ledger, dsn, capsys):
    args = ["--dsn", dsn, "--json", "status", "--run", "r1", "--watch", "0.05", "--timeout", "0.2"]
    assert cli.main(args) == 1
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) >= 2  # one JSON line per poll
    assert "timed out" in captured.err


def test_failed_lists_only_items_whose_current_status_is_failed(ledger, dsn, capsys):
    items = run_json(capsys, dsn, "failed")["items"]
    assert sorted((i["stage"], i["doc_id"]) for i in items) == [("embed", A), ("extract", B)]
    only_429 = run_json(capsys, dsn, "failed", "--error-class", "http_429")["items"]
    assert [(i["stage"], i["error_class"]) for i in only_429] == [("embed", "http_429")]


def test_failed_table_prints_error_text_literally(ledger, dsn, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["--dsn", dsn, "failed", "--stage", "embed"]) == 0
    out = capsys.readouterr().out
    assert "429 [slow] down" in out
    assert "aaaaaaaaaaaa " in out and "a.pdf" in out


def test_dead_letters_lists_open_ones_by_default(ledger, dsn, capsys):
    letters = run_json(capsys, dsn, "dead-letters")["dead_letters"]
    assert [(d["stage"], d["status"], d["owner"]) for d in letters] == [
        ("extract", "open", "alice")
    ]
    every = run_json(capsys, dsn, "dead-letters", "--status", "all")
    assert every["matched"] == 2


def test_rerun_prints_a_valid_conf_the_sql_and_the_matching_count(
    ledger, conn, dsn, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", "200")
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    args = ["rerun", "--stage", "extract", "--status", "failed", "dead"]
    args += ["--code-version-lt", "1.10", "--since", since]
    assert cli.main(["--dsn", dsn, *args]) == 0
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
    assert cli.main(["--dsn", dsn, "rerun", "--stage", "embed", "--doc-id", "abcdef"]) == 2
    assert "--doc-id" in capsys.readouterr().err


def test_rerun_with_a_bad_code_version_exits_2_naming_the_flag(dsn, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--dsn", dsn, "rerun", "--stage", "extract", "--code-version-lt", "1.x"])
    assert exit_.value.code == 2
    assert "--code-version-lt" in capsys.readouterr().err


def test_json_works_before_or_after_the_command(ledger, dsn, capsys):
    assert cli.main(["failed", "--json", "--dsn", dsn]) == 0
    after = json.loads(capsys.readouterr().out)
    assert run_json(capsys, dsn, "failed") == after
    assert after["matched"] == 2


def test_without_a_database_it_exits_2_saying_how_to_get_one(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(cli.ENV_DSN, raising=False)
    monkeypatch.delenv("AIRFLOW_CONN_REPLAYABLE_DB", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert cli.ENV_DSN in err and "replayable_db" in err and "make env" in err


def test_without_a_url_it_reads_airflows_ledger_connection(monkeypatch, dsn, capsys):
    """On an Airflow host the CLI finds the ledger through the connection the DAGs use."""
    monkeypatch.delenv(cli.ENV_DSN, raising=False)
    # The connection exactly as `make env` and the DAGs' Airflow get it.
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_DB", devenv.postgres_conn_json(dsn))
    assert cli.main(["status", "--json"]) == 0
    assert "stages" in json.loads(capsys.readouterr().out)


def test_a_connection_failure_exits_2_without_printing_the_password(capsys):
    assert cli.main(["--dsn", "postgresql://bob:s3cret@127.0.0.1:1/x", "status"]) == 2
    captured = capsys.readouterr()
    assert "cannot connect" in captured.err
    assert "s3cret" not in captured.err + captured.out


def test_statuses_and_version_pattern_agree_with_the_dag_params():
    rerun = pipeline_params("/data")["rerun"].schema["properties"]
    assert cli.ITEM_STATUSES == STATUSES
    assert rerun["code_version_lt"]["pattern"] == cli.VERSION_PATTERN


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


# A file name that, printed raw, writes the clipboard (OSC 52), clears the screen and moves the
# cursor (CSI), recolours what follows, and reverses the rest of the line (RLO).
HOSTILE_NAME = (
    "\x1b]52;c;ZWNobyBwd25lZA==\x07inv\x1b[2J\x1b[1;1H\x1b[31moice\u202efdp.exe\x9b0m.pdf"
)
HOSTILE_ERROR = "bad \x1b]8;;http://evil.example\x07link\x1b]8;;\x07 \x1b[1A\x1b[2Kdone"
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


@pytest.fixture
def hostile(conn, tmp_path):
    """A real file with a hostile name, discovered into the ledger, failed and dead-lettered."""
    from replayable.pipeline import discover

    (tmp_path / HOSTILE_NAME).write_bytes(b"%PDF-1.4 not really")
    found = discover(
        conn, str(tmp_path), dag_id="d", run_id="r1", roots=[str(tmp_path)], max_bytes=2**20
    )
    assert found == 1
    with conn.cursor() as cur:
        cur.execute("SELECT doc_id, uri FROM replayable.documents")
        doc_id, uri = cur.fetchone()
        assert uri.endswith(HOSTILE_NAME)
        cur.execute(
            "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
            " error_class, last_error, code_version, config_hash, run_id, is_current)"
            " VALUES ('extract', 'k', %s, 'failed', 1, 'http_503', %s, '1', 'c', %s, true)",
            (doc_id, HOSTILE_ERROR, "run\x1b[8m"),
        )
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, run_id, owner, note)"
            " VALUES ('embed', 'k', %s, 'http_400', 'terminal', %s, 1, '1', 'r1', %s, %s)",
            (doc_id, HOSTILE_ERROR, "\u202eecila", HOSTILE_ERROR),
        )
    conn.commit()
    return uri


@pytest.mark.parametrize("command", ["failed", "dead-letters"])
def test_tables_print_no_escape_sequence_from_a_hostile_file_name(
    hostile, dsn, capsys, monkeypatch, command
):
    monkeypatch.setenv("COLUMNS", "250")
    assert cli.main(["--dsn", dsn, command]) == 0
    captured = capsys.readouterr()
    for raw in RAW:
        assert raw not in captured.out + captured.err, repr(raw)
    assert "inv" in captured.out and "oice" in captured.out and "\ufffd" in captured.out


@pytest.mark.parametrize("command", ["failed", "dead-letters"])
def test_json_escapes_them_and_keeps_the_text_exact(hostile, dsn, capsys, command):
    assert cli.main(["--dsn", dsn, "--json", command]) == 0
    out = capsys.readouterr().out
    for raw in RAW:
        assert raw not in out, repr(raw)
    assert "\\u001b]52;c;" in out
    data = json.loads(out)
    rows = data["items"] if command == "failed" else data["dead_letters"]
    assert [row["uri"] for row in rows] == [hostile]
    assert HOSTILE_ERROR in {row.get("last_error") or row.get("error") for row in rows}


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
    assert cli.main(["--dsn", dsn, "status"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "x\ufffd" in out


# ---- redrive -----------------------------------------------------------------------------


@pytest.fixture
def letters(ledger, conn):
    """Besides the ledger's: two more open embed letters of A and B, one of class http_400."""
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class,"
            " error_kind, error, attempts, code_version, created_at) VALUES"
            " ('embed', 'ma', %s, 'http_400', 'terminal', 'e', 1, '2.0', now() - interval '1 day'),"
            " ('embed', 'mb', %s, 'http_413', 'terminal', 'e', 1, '2.0', now())"
            " RETURNING id",
            (A, B),
        )
        ids = [row[0] for row in cur.fetchall()]
    conn.commit()
    return ids


def test_redrive_prints_a_valid_conf_and_what_it_matches(letters, conn, dsn, capsys):
    data = run_json(capsys, dsn, "redrive", "--stage", "embed", "--reason", "provider fixed")
    redrive = data["conf"]["redrive"]
    assert {k: v for k, v in redrive.items() if k != "until"} == {
        "stage": "embed",
        "reason": "provider fixed",
    }
    # A filtered redrive ends when the letters were counted: the ones shown are the ones taken.
    until = datetime.fromisoformat(redrive["until"])
    assert datetime.now(UTC) - timedelta(minutes=1) < until <= datetime.now(UTC)
    assert (data["letters"], data["documents"]) == (2, 2)
    param = copy.deepcopy(pipeline_params("/data")["redrive"])
    assert param.resolve(redrive) == redrive
    trigger = next(c for c in data["commands"] if c.startswith("airflow dags trigger"))
    assert json.loads(shlex.split(trigger)[-1]) == data["conf"]
    # And the run that conf starts takes exactly those letters' documents.
    settings = PipelineSettings(redrive=redrive)
    assert select_documents(conn, settings, dag_id="d", run_id="redrive") == 2


def test_redrive_filters_by_id_class_and_time(letters, dsn, capsys):
    by_id = run_json(capsys, dsn, "redrive", "--stage", "embed", "--id", str(letters[1]),
                     "--reason", "one letter", "--by", "ana")  # fmt: skip
    assert by_id["conf"] == {
        "redrive": {"stage": "embed", "ids": [letters[1]], "reason": "one letter", "by": "ana"}
    }
    assert by_id["letters"] == 1
    by_class = run_json(capsys, dsn, "redrive", "--stage", "embed", "--error-class", "http_400",
                        "--reason", "fixed")  # fmt: skip
    assert by_class["conf"]["redrive"]["error_class"] == ["http_400"]
    assert by_class["letters"] == 1
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    recent = run_json(capsys, dsn, "redrive", "--stage", "embed", "--since", since,
                      "--reason", "fixed")  # fmt: skip
    assert recent["letters"] == 1 and recent["conf"]["redrive"]["since"]


def test_redrive_trigger_starts_the_run_as_the_airflow_user_and_prints_its_link(
    letters, dsn, capsys, monkeypatch
):
    monkeypatch.setenv(cli.ENV_AIRFLOW_PASSWORD, PASSWORD)
    with FakeAirflow() as airflow:
        args = ["redrive", "--stage", "embed", "--reason", "provider fixed", "--trigger"]
        data = run_json(capsys, dsn, *args, "--airflow-url", airflow.url, "--username", USERNAME)
    (sent,) = airflow.triggers
    assert sent.authorization == f"Bearer {TOKEN}"
    assert sent.body["logical_date"] is None and sent.body["conf"] == data["conf"]
    assert data["run_id"] == "manual__fake-1"
    assert data["run_url"] == f"{airflow.url}/dags/document_pipeline/runs/manual__fake-1"


def test_redrive_trigger_takes_a_token_from_the_environment(letters, dsn, capsys, monkeypatch):
    monkeypatch.setenv(cli.ENV_AIRFLOW_TOKEN, "jwt-from-env")
    monkeypatch.delenv(cli.ENV_AIRFLOW_USERNAME, raising=False)
    with FakeAirflow() as airflow:
        args = ["--dsn", dsn, "redrive", "--stage", "embed", "--reason", "fixed", "--trigger"]
        assert cli.main([*args, "--airflow-url", airflow.url]) == 0
    assert [s.authorization for s in airflow.sent] == ["Bearer jwt-from-env"]
    out = capsys.readouterr().out
    assert "manual__fake-1" in out and "/dags/document_pipeline/runs/manual__fake-1" in out


def test_a_refused_redrive_exits_2_with_airflows_answer(letters, dsn, capsys, monkeypatch):
    monkeypatch.setenv(cli.ENV_AIRFLOW_TOKEN, "viewer-jwt")
    monkeypatch.delenv(cli.ENV_AIRFLOW_USERNAME, raising=False)
    with FakeAirflow(answer=(403, {"detail": "Forbidden"})) as airflow:
        args = ["--dsn", dsn, "redrive", "--stage", "embed", "--reason", "fixed", "--trigger"]
        assert cli.main([*args, "--airflow-url", airflow.url]) == 2
    assert "Airflow refused: 403 Forbidden" in capsys.readouterr().err


def test_redrive_trigger_without_credentials_exits_2_saying_what_to_set(
    letters, dsn, capsys, monkeypatch
):
    for name in (cli.ENV_AIRFLOW_TOKEN, cli.ENV_AIRFLOW_USERNAME):
        monkeypatch.delenv(name, raising=False)
    args = ["--dsn", dsn, "redrive", "--stage", "embed", "--reason", "fixed", "--trigger"]
    assert cli.main([*args, "--airflow-url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert cli.ENV_AIRFLOW_TOKEN in err and cli.ENV_AIRFLOW_PASSWORD in err


def test_redrive_trigger_with_nothing_to_redrive_exits_1_and_asks_nothing(
    ledger, dsn, capsys, monkeypatch
):
    monkeypatch.setenv(cli.ENV_AIRFLOW_TOKEN, "jwt")
    with FakeAirflow() as airflow:
        args = ["--dsn", dsn, "redrive", "--stage", "chunk", "--reason", "fixed", "--trigger"]
        assert cli.main([*args, "--airflow-url", airflow.url]) == 1
    assert airflow.sent == [] and "nothing to redrive" in capsys.readouterr().err


@pytest.mark.parametrize("reason", ["ab", "two\nlines"])
def test_redrive_needs_a_one_line_reason_of_three_characters(dsn, capsys, reason):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--dsn", dsn, "redrive", "--stage", "embed", "--reason", reason])
    assert exit_.value.code == 2 and "--reason" in capsys.readouterr().err
