"""document_pipeline through Airflow itself (`airflow dags test`), real Postgres, real server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from devtools import devenv

import corpus
from checks import SAMPLES, assert_nothing_lost, output_rows, rows, scalar, subset

pytestmark = pytest.mark.e2e

STAGES = ("extract", "chunk", "embed")


def test_sample_corpus_runs_to_done_and_a_second_run_costs_nothing(run_dag, conn, model):
    first = run_dag({"source": str(SAMPLES), "batch_size": 8})
    assert first["_returncode"] == 0, first["_log"]
    documents = len(list(SAMPLES.glob("*.pdf")))
    for stage in STAGES:
        assert first["stages"][stage]["done"] == documents, (stage, first["stages"][stage])
    assert first["model_calls"]["ok"] > 0
    assert_nothing_lost(conn)
    before = output_rows(conn)
    requests = model.stats()["requests"]

    second = run_dag({"source": str(SAMPLES), "batch_size": 8})
    assert second["_returncode"] == 0, second["_log"]
    assert second["model_calls"]["calls"] == 0
    assert model.stats()["requests"] == requests
    assert output_rows(conn) == before
    assert all(second["stages"][s]["done"] == documents for s in STAGES)


def test_transient_faults_end_done_with_one_paid_call_per_chunk(run_dag, conn, model, tmp_path):
    model.set_faults(status_rates={"503": 0.3, "429": 0.1}, retry_after="1", seed=5)
    report = run_dag({"source": str(subset(tmp_path, 10)), "batch_size": 5})
    assert report["_returncode"] == 0, report["_log"]
    assert all(report["stages"][s]["done"] == 10 for s in STAGES)
    stats = model.stats()
    assert stats["failed"] > 0
    chunks = scalar(conn, "SELECT count(*) FROM replayable.chunks")
    assert set(stats["input_success_counts"].values()) == {1}
    assert stats["inputs_embedded"] == chunks
    assert (
        scalar(conn, "SELECT sum(n_inputs) FROM replayable.model_calls WHERE status = 'ok'")
        == chunks
    )
    assert scalar(conn, "SELECT count(*) FROM replayable.model_calls WHERE status <> 'ok'") > 0
    assert_nothing_lost(conn)


def test_a_bad_request_dead_letters_the_item_after_one_attempt(run_dag, conn, model, tmp_path):
    folder = subset(tmp_path, 4)
    corpus.write_pdf(folder / "poisoned.pdf", ["This text makes the provider answer POISON-400."])
    model.set_faults(fail_inputs_containing={"POISON-400": 400})
    report = run_dag({"source": str(folder), "batch_size": 5})
    assert report["_returncode"] == 0, report["_log"]
    assert report["stages"]["embed"]["done"] == 4
    assert report["stages"]["embed"]["dead"] == 1
    assert rows(conn, "SELECT error_class, attempts, status FROM replayable.dead_letters") == [
        ("http_400", 1, "open")
    ]
    assert_nothing_lost(conn)


def test_an_auth_error_fails_the_task_without_dead_lettering(run_dag, conn, model, tmp_path):
    model.set_faults(status_always=401)
    report = run_dag({"source": str(subset(tmp_path, 6)), "batch_size": 3})
    assert report["_returncode"] != 0  # the run fails: its items are left to do
    assert report["stages"]["embed"]["failed"] == 6
    assert report["stages"]["embed"]["dead"] == 0
    assert scalar(conn, "SELECT count(*) FROM replayable.dead_letters") == 0
    # One refused request per batch: it goes out alone first, the batch stops at its 401 and
    # is not retried.
    assert model.stats()["requests"] == 2
    assert (
        scalar(conn, "SELECT max(attempts) FROM replayable.stage_runs WHERE stage = 'embed'") == 0
    )
    assert_nothing_lost(conn)


EXPECTED_POISON = {
    "zero_bytes": "not_pdf",
    "not_pdf": "not_pdf",
    "truncated": "malformed",
    "encrypted": "encrypted",
    "oversize": "oversize",
    "slow": "timeout",
    "memory_bomb": "memory",
}


def test_poison_documents_are_dead_lettered_and_the_rest_finish(run_dag, conn, model, tmp_path):
    folder = subset(tmp_path, 5)
    poison = corpus.write_poison_corpus(folder)
    assert set(poison) == set(EXPECTED_POISON)
    conf = {
        "source": str(folder),
        "batch_size": 6,
        "max_bytes": 2_000_000,
        "item_timeout_s": 3,
        "memory_mb": 512,
        "max_attempts": 2,
    }
    report = run_dag(conf)
    assert report["_returncode"] == 0, report["_log"]
    classes = dict(
        rows(
            conn,
            "SELECT d.uri, s.error_class FROM replayable.stage_runs s"
            " JOIN replayable.documents d USING (doc_id) WHERE s.stage = 'extract'"
            " AND s.status = 'dead'",
        )
    )
    by_name = {Path(uri).name: error_class for uri, error_class in classes.items()}
    # zero_bytes and not_pdf are both "not a PDF"; compare by file.
    assert by_name == {poison[k].name: v for k, v in EXPECTED_POISON.items()}
    assert report["stages"]["embed"]["done"] == 5
    letters = rows(conn, "SELECT error_class, traceback FROM replayable.dead_letters")
    assert len(letters) == len(EXPECTED_POISON)
    assert all(tb and "Traceback" in tb for _, tb in letters)
    assert_nothing_lost(conn)


def _start_dag_run(
    airflow_env: dict[str, str], conf: dict[str, Any], log: Path
) -> subprocess.Popen[bytes]:
    airflow = str(Path(sys.executable).with_name("airflow"))
    return subprocess.Popen(
        [airflow, "dags", "test", devenv.DAG_ID, "--conf", json.dumps(conf)],
        env={**os.environ, **airflow_env},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_a_killed_run_redoes_only_its_unfinished_items(
    run_dag, airflow_env, dsn, conn, model, tmp_path
):
    """SIGKILL mid-embed; the re-run pays only for chunks without a vector, each once in all."""
    conf = {
        "source": str(subset(tmp_path, 12)),
        "batch_size": 12,
        "lease_s": 4,
        "item_timeout_s": 2,
        "embed_inputs_per_call": 8,
    }
    model.set_faults(latency_ms=300)
    proc = _start_dag_run(airflow_env, conf, tmp_path / "killed.log")
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            total = scalar(conn, "SELECT count(*) FROM replayable.chunks")
            stored = scalar(conn, "SELECT count(*) FROM replayable.embeddings")
            if total and stored >= total // 3:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    stored_before = scalar(conn, "SELECT count(*) FROM replayable.embeddings")
    assert 0 < stored_before < total

    model.set_faults(latency_ms=0)
    report = run_dag(conf)
    assert report["_returncode"] == 0, report["_log"]
    assert report["stages"]["embed"]["done"] == 12
    sent_again = scalar(
        conn,
        "SELECT coalesce(sum(n_inputs), 0) FROM replayable.model_calls"
        " WHERE run_id = %s AND status = 'ok'",
        report["run_id"],
    )
    assert sent_again == total - stored_before
    # A request in flight at the kill was charged; the re-run sent the same chunks under the
    # same key, and the provider answered it again without charging.
    assert set(model.stats()["input_success_counts"].values()) == {1}
    assert_nothing_lost(conn)
