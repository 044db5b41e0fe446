"""``replayable redrive``: the conf, what it matches, and --trigger as an Airflow user."""

import copy
import json
import shlex
from datetime import UTC, datetime, timedelta

import pytest
from cli_ledger import A, B, fill_ledger, run_json

from fake_airflow import PASSWORD, TOKEN, USERNAME, FakeAirflow
from replayable import config
from replayable.airflow.params import pipeline_params
from replayable.cli import main
from replayable.pipeline import select_documents
from replayable.settings import PipelineSettings


@pytest.fixture
def ledger(conn):
    """A, B and C in a few stages and runs: r1 touched A and B, r2 touched C."""
    fill_ledger(conn)


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
    monkeypatch.setenv(config.AIRFLOW_PASSWORD_ENV, PASSWORD)
    with FakeAirflow() as airflow:
        args = ["redrive", "--stage", "embed", "--reason", "provider fixed", "--trigger"]
        data = run_json(capsys, dsn, *args, "--airflow-url", airflow.url, "--username", USERNAME)
    (sent,) = airflow.triggers
    assert sent.authorization == f"Bearer {TOKEN}"
    assert sent.body["logical_date"] is None and sent.body["conf"] == data["conf"]
    assert data["run_id"] == "manual__fake-1"
    assert data["run_url"] == f"{airflow.url}/dags/document_pipeline/runs/manual__fake-1"


def test_redrive_trigger_takes_a_token_from_the_environment(letters, dsn, capsys, monkeypatch):
    monkeypatch.setenv(config.AIRFLOW_TOKEN_ENV, "jwt-from-env")
    monkeypatch.delenv(config.AIRFLOW_USERNAME_ENV, raising=False)
    with FakeAirflow() as airflow:
        args = ["--dsn", dsn, "redrive", "--stage", "embed", "--reason", "fixed", "--trigger"]
        assert main([*args, "--airflow-url", airflow.url]) == 0
    assert [s.authorization for s in airflow.sent] == ["Bearer jwt-from-env"]
    out = capsys.readouterr().out
    assert "manual__fake-1" in out and "/dags/document_pipeline/runs/manual__fake-1" in out


def test_a_refused_redrive_exits_2_with_airflows_answer(letters, dsn, capsys, monkeypatch):
    monkeypatch.setenv(config.AIRFLOW_TOKEN_ENV, "viewer-jwt")
    monkeypatch.delenv(config.AIRFLOW_USERNAME_ENV, raising=False)
    with FakeAirflow(answer=(403, {"detail": "Forbidden"})) as airflow:
        args = ["--dsn", dsn, "redrive", "--stage", "embed", "--reason", "fixed", "--trigger"]
        assert main([*args, "--airflow-url", airflow.url]) == 2
    assert "Airflow refused: 403 Forbidden" in capsys.readouterr().err


def test_redrive_trigger_without_credentials_exits_2_saying_what_to_set(
    letters, dsn, capsys, monkeypatch
):
    for name in (config.AIRFLOW_TOKEN_ENV, config.AIRFLOW_USERNAME_ENV):
        monkeypatch.delenv(name, raising=False)
    args = ["--dsn", dsn, "redrive", "--stage", "embed", "--reason", "fixed", "--trigger"]
    assert main([*args, "--airflow-url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert config.AIRFLOW_TOKEN_ENV in err and config.AIRFLOW_PASSWORD_ENV in err


def test_redrive_trigger_with_nothing_to_redrive_exits_1_and_asks_nothing(
    ledger, dsn, capsys, monkeypatch
):
    monkeypatch.setenv(config.AIRFLOW_TOKEN_ENV, "jwt")
    with FakeAirflow() as airflow:
        args = ["--dsn", dsn, "redrive", "--stage", "chunk", "--reason", "fixed", "--trigger"]
        assert main([*args, "--airflow-url", airflow.url]) == 1
    assert airflow.sent == [] and "nothing to redrive" in capsys.readouterr().err


@pytest.mark.parametrize("reason", ["ab", "two\nlines"])
def test_redrive_needs_a_one_line_reason_of_three_characters(dsn, capsys, reason):
    with pytest.raises(SystemExit) as exit_:
        main(["--dsn", dsn, "redrive", "--stage", "embed", "--reason", reason])
    assert exit_.value.code == 2 and "--reason" in capsys.readouterr().err
