"""Operating the pipeline: partial re-runs, code-version bumps and dead-letter redrive."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import corpus
from checks import assert_nothing_lost, rows, scalar, subset

pytestmark = pytest.mark.e2e


def changed_docs(conn: Any, since: datetime) -> set[str]:
    """Documents whose ledger rows changed after ``since``."""
    return {
        doc
        for (doc,) in rows(
            conn, "SELECT DISTINCT doc_id FROM replayable.stage_runs WHERE updated_at > %s", since
        )
    }


def docs_by_name(conn: Any) -> dict[str, str]:
    return {
        Path(uri).name: doc
        for doc, uri in rows(conn, "SELECT doc_id, uri FROM replayable.documents")
    }


def test_a_partial_rerun_touches_only_the_selected_documents(run_dag, conn, model, tmp_path):
    folder = subset(tmp_path, 8)
    sizes = sorted(p.stat().st_size for p in folder.iterdir())
    limit = sizes[5]  # the two largest documents are too big for the first run
    first = run_dag({"source": str(folder), "batch_size": 4, "max_bytes": limit})
    assert first["_returncode"] == 0, first["_log"]
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
    second = run_dag({"rerun": rerun, "max_bytes": 20_000_000, "batch_size": 4})
    assert second["_returncode"] == 0, second["_log"]
    assert second["documents"] == 2
    assert all(second["stages"][s]["done"] == 2 for s in ("extract", "chunk", "embed"))
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
    run_dag, conn, model, tmp_path
):
    folder = subset(tmp_path, 6)
    first = run_dag({"source": str(folder), "batch_size": 3})
    assert first["_returncode"] == 0, first["_log"]
    embeddings = scalar(conn, "SELECT count(*) FROM replayable.embeddings")

    # Deploying an extractor with a new version, without editing the source under test.
    bump = tmp_path / "bump"
    bump.mkdir()
    (bump / "sitecustomize.py").write_text(
        "import replayable.stages.extract as extract\nextract.VERSION = '1.1'\n"
    )
    pythonpath = os.pathsep.join([str(bump), run_dag.env["PYTHONPATH"]])
    env = {"PYTHONPATH": pythonpath}

    # A re-run selected by code version finds the documents last extracted before 1.1.
    rerun = {"rerun": {"stage": "extract", "code_version_lt": "1.1"}, "batch_size": 3}
    second = run_dag(rerun, env=env)
    assert second["_returncode"] == 0, second["_log"]
    assert second["documents"] == 6
    versions = dict(
        rows(
            conn,
            "SELECT extractor_version, count(*) FROM replayable.extractions"
            " GROUP BY extractor_version",
        )
    )
    assert versions == {"1.0": 6, "1.1": 6}
    assert second["model_calls"]["calls"] == 0
    assert scalar(conn, "SELECT count(*) FROM replayable.embeddings") == embeddings
    assert all(second["stages"][s]["done"] == 6 for s in ("extract", "chunk", "embed"))

    # Now nothing is older than 1.1, and a plain run finds every document done.
    assert run_dag(rerun, env=env)["documents"] == 0
    third = run_dag({"source": str(folder), "batch_size": 3}, env=env)
    assert (third["documents"], third["to_do"], third["batches"]) == (6, 0, 0)
    assert all(third["stages"][s]["done"] == 6 for s in ("extract", "chunk", "embed"))
    assert_nothing_lost(conn, one_version=False)


def test_redrive_brings_dead_letters_back_and_ignored_ones_stay_out(run_dag, conn, model, tmp_path):
    folder = subset(tmp_path, 3)
    for n in range(4):
        corpus.write_pdf(
            folder / f"poisoned-{n}.pdf",
            [f"Poisoned report number {n}. The provider rejects POISON-400 text."],
        )
    model.set_faults(fail_inputs_containing={"POISON-400": 400})
    first = run_dag({"source": str(folder), "batch_size": 4})
    assert first["_returncode"] == 0, first["_log"]
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
    second = run_dag({"redrive": redrive, "batch_size": 4})
    assert second["_returncode"] == 0, second["_log"]
    assert second["documents"] == 3
    assert second["stages"]["embed"]["done"] == 3
    resolved = rows(
        conn,
        "SELECT status, resolved_by, resolution, resolved_at IS NOT NULL"
        " FROM replayable.dead_letters WHERE id <> %s",
        ignored_id,
    )
    # The actor is who triggered the run (``airflow dags test`` names none: its run type);
    # the conf's ``by`` is only a note in the resolution, so nobody can sign as someone else.
    assert {(status, by, at) for status, by, _, at in resolved} == {("redriven", "dag_test", True)}
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
