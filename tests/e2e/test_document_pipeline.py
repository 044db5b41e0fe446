"""document_pipeline through Airflow itself (`airflow dags test`), real Postgres, real server.

Faults and bad files run in process (tests/replayable/test_pipeline_in_process.py); here
are what needs Airflow: a mapped run of the samples that announces each document once,
rerun for free, and a killed run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from checks import (
    SAMPLES,
    assert_nothing_lost,
    asset_events,
    metadata_rows,
    output_rows,
    rows,
    scalar,
    subset,
    task_states,
)
from devtools import devenv
from helpers import ROOT

pytestmark = pytest.mark.e2e

STAGES = ("extract", "chunk", "embed")
HOOK = "replayable"  # the receiver the tests' events connection points at (devenv)
DEMO_MODEL = "local-wordllama-256"


def readme_search() -> tuple[str, str]:
    """The question the README asks after ``make demo``, and the sample it says ranks first."""
    readme = (ROOT / "README.md").read_text()
    question = re.search(r'replayable search "([^"]+)"\n', readme)
    expected = re.search(r"ranks\s+`(doc-[^`]+\.pdf)`\s+first", readme)
    assert question and expected, "the README shows a search after make demo"
    return question.group(1), expected.group(1)


def test_sample_corpus_runs_to_done_announcing_each_document_once_and_a_rerun_costs_nothing(
    run_dag, airflow_env, conn, model
):
    # The conf `make demo` runs: every stage, summaries too, with the bundled real model.
    conf = {
        "source": str(SAMPLES),
        "batch_size": 8,
        "model": DEMO_MODEL,
        "stages": [*STAGES, "summarize"],
    }
    first = run_dag(conf)
    assert first["_returncode"] == 0, first["_log"]
    documents = len(list(SAMPLES.glob("*.pdf")))
    for stage in (*STAGES, "summarize"):
        assert first["stages"][stage]["done"] == documents, (stage, first["stages"][stage])
    assert first["model_calls"]["ok"] > 0
    texts = scalar(conn, "SELECT count(DISTINCT text_sha256) FROM replayable.extractions")
    assert first["model_calls_by_stage"]["summarize"] == texts == model.stats()["chat_charged"]
    assert_nothing_lost(conn)
    # The publish task announced every document once: outbox rows, webhook, asset event.
    ready = rows(
        conn,
        "SELECT aggregate_id, event_id, status, published_by FROM replayable.outbox"
        " WHERE event_type = 'document.ready'",
    )
    assert len(ready) == documents
    assert {doc for doc, *_ in ready} == {
        doc for (doc,) in rows(conn, "SELECT doc_id FROM replayable.documents")
    }
    publication = f"document_pipeline/{first['run_id']}/publish"
    assert {(status, by) for _, _, status, by in ready} == {("published", publication)}
    stored = model.webhook_events(HOOK)
    assert sorted(e["key"] for e in stored) == sorted(event_id for _, event_id, _, _ in ready)
    assert {e["body"]["type"] for e in stored} == {"document.ready"}
    assert model.stats()["webhooks"]["deduplicated"] == 0
    assert asset_events(airflow_env, first["run_id"]) == [
        {"publication": publication, "ready": documents}
    ]
    before = output_rows(conn)
    requests = model.stats()["requests"]
    received = model.stats()["webhooks"]["received"]

    # The same run again pays for nothing and announces nothing.
    second = run_dag(conf)
    assert second["_returncode"] == 0, second["_log"]
    assert second["model_calls"]["calls"] == 0
    assert model.stats()["chat_charged"] == texts
    assert model.stats()["requests"] == requests
    assert output_rows(conn) == before
    assert all(second["stages"][s]["done"] == documents for s in STAGES)
    assert scalar(conn, "SELECT count(*) FROM replayable.outbox") == documents
    assert model.stats()["webhooks"]["received"] == received
    # It announces nothing, and it ends as soon as Airflow records its tasks: publish
    # succeeds without an asset event (a skip is recorded only after its process exits), and
    # plan skips the batch tasks itself before it ends, where the scheduler would take a loop
    # per stage, then leaves the empty list a cleared batch task expands over (ADR 0124).
    assert asset_events(airflow_env, second["run_id"]) == []
    states = task_states(airflow_env, "document_pipeline", second["run_id"])
    assert states["publish"] == "success"
    batch_tasks = {task for task in states if task.startswith("batch.")}
    assert batch_tasks == {f"batch.{stage}" for stage in (*STAGES, "summarize")}
    assert {states[task] for task in batch_tasks} == {"skipped"}
    assert metadata_rows(
        airflow_env,
        "SELECT count(*) FROM task_instance WHERE run_id = %s AND task_id LIKE 'batch.%%'"
        " AND end_date <= (SELECT end_date FROM task_instance WHERE run_id = %s"
        " AND task_id = 'plan')",
        second["run_id"],
        second["run_id"],
    ) == [(len(batch_tasks),)]
    assert metadata_rows(
        airflow_env,
        "SELECT length FROM task_map WHERE run_id = %s AND task_id = 'plan'",
        second["run_id"],
    ) == [(0,)]

    # The README's question after the demo, which names no model, finds the sample document
    # it names, first: the search reads the model that holds the demo's vectors.
    question, expected = readme_search()
    command = [str(Path(sys.executable).with_name("replayable")), "--json", "search", question]
    done = subprocess.run(
        [*command, "--k", "3"],
        env={**os.environ, **airflow_env},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert Path(json.loads(done.stdout)["hits"][0]["uri"]).name == expected  # stdout: JSON only


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


def test_a_pipeline_with_a_stage_of_your_own_runs_through_airflow_and_reruns_for_free(
    run_dag, conn, tmp_path
):
    """keyword_pipeline: extract, then Keywords, a stage defined in dags/custom_stages/ and
    not in the package, as Airflow parses and runs it; a poisoned document (no words) ends
    dead with the stage's own class, and a second run maps nothing."""
    import corpus

    folder = subset(tmp_path, 4)
    corpus.write_pdf(folder / "numbers.pdf", ["123 456 789 0 42"])
    first = run_dag({"source": str(folder)}, dag_id="keyword_pipeline")
    assert first["_returncode"] == 0, first["_log"]
    assert first["dag_id"] == "keyword_pipeline"
    assert list(first["stages"]) == ["extract", "keywords"]
    assert (first["stages"]["keywords"]["done"], first["stages"]["keywords"]["dead"]) == (4, 1)
    assert rows(conn, "SELECT stage, error_class FROM replayable.dead_letters") == [
        ("keywords", "no_words")
    ]
    stored = scalar(conn, "SELECT count(*) FROM replayable.artifacts WHERE stage = 'keywords'")
    assert stored == 4

    second = run_dag({"source": str(folder)}, dag_id="keyword_pipeline")
    assert second["_returncode"] == 0, second["_log"]
    assert (second["to_do"], second["batches"]) == (0, 0)
    assert scalar(conn, "SELECT count(*) FROM replayable.artifacts") == stored
