"""The pipeline's faults, bad files, re-run selection and a code-version bump, run in this process.

Each test runs document_pipeline's own plan, stage operators (``execute``, with the DAG's
retries and retry policy) and report against the real Postgres and model server
(tests/in_process.py). They were ``airflow dags test`` runs; Airflow's part of them (mapping,
scheduling) is shown once by the real-Airflow runs in tests/e2e/.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import corpus
from checks import assert_nothing_lost, rows, scalar, subset
from replayable.stages import extract

STAGES = ("extract", "chunk", "embed")


def test_transient_faults_end_done_with_one_paid_call_per_chunk(
    run_in_process, conn, model, tmp_path
):
    model.set_faults(status_rates={"503": 0.3, "429": 0.1}, retry_after="1", seed=5)
    report = run_in_process({"source": str(subset(tmp_path, 10)), "batch_size": 5})
    assert not report["_failed"], report["_tasks"]
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


def test_a_bad_request_dead_letters_the_item_after_one_attempt(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 4)
    corpus.write_pdf(folder / "poisoned.pdf", ["This text makes the provider answer POISON-400."])
    model.set_faults(fail_inputs_containing={"POISON-400": 400})
    report = run_in_process({"source": str(folder), "batch_size": 5})
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["embed"]["done"] == 4
    assert report["stages"]["embed"]["dead"] == 1
    assert rows(conn, "SELECT error_class, attempts, status FROM replayable.dead_letters") == [
        ("http_400", 1, "open")
    ]
    assert_nothing_lost(conn)


def test_an_auth_error_fails_the_task_without_dead_lettering(run_in_process, conn, model, tmp_path):
    model.set_faults(status_always=401)
    report = run_in_process({"source": str(subset(tmp_path, 6)), "batch_size": 3})
    assert report["_failed"]  # the run fails: its items are left to do
    # Each embed task fails on its first try: the retry policy does not retry a 401.
    embeds = {key: o for key, o in report["_tasks"].items() if key[0] == "batch.embed"}
    assert [(o.state, o.tries) for o in embeds.values()] == [("failed", 1)] * 2
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
    # PDFium fills memory with the bomb's text at about 150 MiB/s: 1,024 MiB take it some
    # 7 s, far past item_timeout_s. The chaos runs see it end as memory (at 256 MiB).
    "memory_bomb": "timeout",
}


@pytest.mark.containment
def test_poison_documents_are_dead_lettered_and_the_rest_finish(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 5)
    poison = corpus.write_poison_corpus(folder)
    assert set(poison) == set(EXPECTED_POISON)
    conf = {
        "source": str(folder),
        "batch_size": 6,
        "max_bytes": 2_000_000,
        "item_timeout_s": 0.5,
        "memory_mb": 1024,
        "max_attempts": 2,
    }
    report = run_in_process(conf)
    assert not report["_failed"], report["_tasks"]
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


def changed_docs(conn: Any, since: datetime) -> set[str]:
    """Documents whose ledger rows changed after ``since``."""
    return {
        doc
        for (doc,) in rows(
            conn,
            "SELECT DISTINCT doc_id FROM replayable.stage_runs WHERE updated_at > %s",
            since,
        )
    }


def test_a_partial_rerun_touches_only_the_selected_documents(run_in_process, conn, model, tmp_path):
    folder = subset(tmp_path, 8)
    sizes = sorted(p.stat().st_size for p in folder.iterdir())
    limit = sizes[5]  # the two largest documents are too big for the first run
    first = run_in_process({"source": str(folder), "batch_size": 4, "max_bytes": limit})
    assert not first["_failed"], first["_tasks"]
    oversize = {
        uri
        for (uri,) in rows(
            conn,
            "SELECT d.uri FROM replayable.stage_runs s JOIN replayable.documents d"
            " USING (doc_id) WHERE s.error_class = 'oversize'",
        )
    }
    assert len(oversize) == 2
    calls_before = model.stats()["requests"]
    started = datetime.now(UTC)

    # Too large to read, they were named after their stat; now they fit, they are hashed.
    rerun = {"stage": "extract", "status": ["failed", "dead"], "error_class": ["oversize"]}
    second = run_in_process({"rerun": rerun, "max_bytes": 20_000_000, "batch_size": 4})
    assert not second["_failed"], second["_tasks"]
    assert second["documents"] == 2
    assert all(second["stages"][s]["done"] == 2 for s in STAGES)
    by_uri = {
        uri: doc
        for doc, uri in rows(conn, "SELECT doc_id, uri FROM replayable.documents WHERE NOT stat_id")
    }
    redone = {by_uri[uri] for uri in oversize}
    assert changed_docs(conn, started) == redone
    called = {
        doc
        for (doc,) in rows(
            conn,
            "SELECT DISTINCT s.doc_id FROM replayable.model_calls m"
            " JOIN replayable.model_call_items i ON i.call_id = m.id"
            " JOIN replayable.stage_runs s ON s.stage = m.stage AND s.item_key = i.item_key"
            " WHERE m.run_id = %s",
            second["run_id"],
        )
    }
    assert called == redone
    assert model.stats()["requests"] - calls_before == second["model_calls"]["calls"] > 0
    notes = rows(conn, "SELECT status, resolution FROM replayable.dead_letters")
    assert len(notes) == 2
    assert all(status == "redriven" and "fits max_bytes" in why for status, why in notes)
    # The stat-named documents are history now: no current row counts them as dead.
    assert (
        scalar(
            conn, "SELECT count(*) FROM replayable.stage_runs WHERE is_current AND status = 'dead'"
        )
        == 0
    )
    assert_nothing_lost(conn, one_version=False)


def test_a_code_version_bump_reextracts_and_unchanged_text_costs_no_embedding(
    run_in_process, conn, model, tmp_path, monkeypatch
):
    folder = subset(tmp_path, 6)
    first = run_in_process({"source": str(folder), "batch_size": 3})
    assert not first["_failed"], first["_tasks"]
    embeddings = scalar(conn, "SELECT count(*) FROM replayable.embeddings")
    calls_before = model.stats()["requests"]

    # Deploying an extractor with a new version: the planner and the stage read it.
    before = extract.extractor_id()
    monkeypatch.setattr(extract, "VERSION", "99.1")

    # A re-run selected by code version finds the documents last extracted before 99.1.
    rerun = {"rerun": {"stage": "extract", "code_version_lt": "99.1"}, "batch_size": 3}
    second = run_in_process(rerun)
    assert not second["_failed"], second["_tasks"]
    assert second["documents"] == 6
    versions = dict(
        rows(
            conn,
            "SELECT extractor_version, count(*) FROM replayable.extractions"
            " GROUP BY extractor_version",
        )
    )
    assert versions == {before: 6, "99.1+pdfium": 6}
    # The same text under the new extractor keys to the chunks and vectors already paid for.
    assert second["model_calls"]["calls"] == 0
    assert model.stats()["requests"] == calls_before
    assert scalar(conn, "SELECT count(*) FROM replayable.embeddings") == embeddings
    assert all(second["stages"][s]["done"] == 6 for s in STAGES)

    # Now nothing is older than 99.1, and a plain run finds every document done.
    assert run_in_process(rerun)["documents"] == 0
    third = run_in_process({"source": str(folder), "batch_size": 3})
    assert (third["documents"], third["to_do"], third["batches"]) == (6, 0, 0)
    assert all(third["stages"][s]["done"] == 6 for s in STAGES)
    assert_nothing_lost(conn, one_version=False)


def test_the_engine_is_recorded_and_another_engine_policy_reextracts(
    run_in_process, conn, model, tmp_path
):
    """The engine policy is part of the extract key, and each extraction names the engine
    that read its text (ADR 0103)."""
    folder = subset(tmp_path, 3)
    default = {"source": str(folder), "batch_size": 3}
    first = run_in_process(default)
    assert not first["_failed"], first["_tasks"]
    assert run_in_process(default)["to_do"] == 0
    by_pypdf = run_in_process({**default, "extractor": "pypdf"})
    assert not by_pypdf["_failed"], by_pypdf["_tasks"]
    assert by_pypdf["to_do"] == 3
    assert all(by_pypdf["stages"][s]["done"] == 3 for s in STAGES)
    assert rows(
        conn,
        "SELECT extractor_version, engine, count(*) FROM replayable.extractions"
        " GROUP BY 1, 2 ORDER BY 1",
    ) == [
        (extract.extractor_id("pdfium"), "pdfium", 3),
        (extract.extractor_id("pypdf"), "pypdf", 3),
    ]
    assert run_in_process({**default, "extractor": "pypdf"})["to_do"] == 0
    assert_nothing_lost(conn, one_version=False)


def test_redrive_brings_dead_letters_back_and_ignored_ones_stay_out(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 3)
    for n in range(4):
        corpus.write_pdf(
            folder / f"poisoned-{n}.pdf",
            [f"Poisoned report number {n}. The provider rejects POISON-400 text."],
        )
    model.set_faults(fail_inputs_containing={"POISON-400": 400})
    first = run_in_process({"source": str(folder), "batch_size": 4})
    assert not first["_failed"], first["_tasks"]
    letters = rows(conn, "SELECT id, doc_id FROM replayable.dead_letters ORDER BY id")
    assert len(letters) == 4
    ignored_id, ignored_doc = letters[0]
    with conn.cursor() as cur:
        cur.execute(
            "UPDATE replayable.dead_letters SET status = 'ignored', owner = 'oncall',"
            " note = 'known bad' WHERE id = %s",
            (ignored_id,),
        )
    conn.commit()

    model.clear_faults()
    redrive = {
        "stage": "embed",
        "error_class": ["http_400"],
        "reason": "provider fixed",
        "by": "oncall",
    }
    run_in_process.user = "ana"
    second = run_in_process({"redrive": redrive, "batch_size": 4})
    assert not second["_failed"], second["_tasks"]
    assert second["documents"] == 3
    assert second["stages"]["embed"]["done"] == 3
    resolved = rows(
        conn,
        "SELECT status, resolved_by, resolution, resolved_at IS NOT NULL"
        " FROM replayable.dead_letters WHERE id <> %s",
        ignored_id,
    )
    # The actor is who triggered the run; the conf's ``by`` is only a note in the
    # resolution, so nobody can sign as someone else.
    assert {(status, by, at) for status, by, _, at in resolved} == {("redriven", "ana", True)}
    assert all(
        reason.startswith("provider fixed (run ") and reason.endswith("; note: oncall)")
        for _, _, reason, _ in resolved
    )
    assert len(resolved) == 3
    assert rows(
        conn,
        "SELECT status FROM replayable.stage_runs WHERE stage = 'embed' AND doc_id = %s",
        ignored_doc,
    ) == [("dead",)]
    assert_nothing_lost(conn)
