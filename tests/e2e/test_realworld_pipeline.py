"""document_pipeline through Airflow over PDFs from real producers (see tests/realworld.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks import assert_nothing_lost, rows

pytestmark = pytest.mark.e2e

# The session fixture realworld_corpus, shared with tests/test_realworld.py.
pytest_plugins = ["realworld_fixture"]

STAGES = ("extract", "chunk", "embed")


def test_readable_pdfs_with_text_end_done_and_the_rest_dead_with_a_class(
    run_dag, conn, model, realworld_corpus
):
    report = run_dag({"source": str(realworld_corpus.folder), "batch_size": 10})
    assert report["_returncode"] == 0, report["_log"]
    status = {
        (Path(uri).name, stage): (state, error_class)
        for uri, stage, state, error_class in rows(
            conn,
            "SELECT d.uri, s.stage, s.status, s.error_class FROM replayable.stage_runs s"
            " JOIN replayable.documents d USING (doc_id)",
        )
    }
    wrong = {}
    for entry in realworld_corpus.files:
        if entry.extractable:
            states = {stage: status.get((entry.file, stage), (None, None))[0] for stage in STAGES}
            if set(states.values()) != {"done"}:
                wrong[entry.file] = states
        else:
            state, error_class = status.get((entry.file, "extract"), (None, None))
            if state != "dead" or not error_class:
                wrong[entry.file] = {"extract": (state, error_class), "expected": "dead"}
    assert wrong == {}, report["_log"]
    extractable = sum(e.extractable for e in realworld_corpus.files)
    assert report["documents"] == len(realworld_corpus.files)
    for stage in STAGES:
        assert report["stages"][stage]["done"] == extractable, (stage, report["stages"][stage])
    assert report["stages"]["extract"]["dead"] == len(realworld_corpus.files) - extractable
    assert_nothing_lost(conn)
