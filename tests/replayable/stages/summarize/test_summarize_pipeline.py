"""The summarize stage in document_pipeline, run in this process against Postgres and the
local model server: what it pays for, what a re-run and a new prompt redo, what it refuses.

Every count of paid calls is the model server's own (``chat_charged``: charged chat answers;
``charged - chat_charged``: charged embeddings requests).
"""

from __future__ import annotations

import corpus
from checks import assert_nothing_lost, rows, scalar, subset

ALL = ["extract", "chunk", "embed", "summarize"]


def _paid(model) -> tuple[int, int]:
    """(embeddings requests, chat answers) the provider charged for so far."""
    stats = model.stats()
    return stats["charged"] - stats["chat_charged"], stats["chat_charged"]


def test_summaries_are_paid_once_and_an_identical_rerun_pays_no_chat_call(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 6)
    first = run_in_process({"source": str(folder), "stages": ALL})
    assert not first["_failed"], first["_tasks"]
    assert first["stages"]["summarize"]["done"] == 6
    texts = scalar(conn, "SELECT count(DISTINCT text_sha256) FROM replayable.extractions")
    assert _paid(model)[1] == texts
    assert first["model_calls_by_stage"]["summarize"] == texts
    summaries = rows(
        conn,
        "SELECT a.data->>'summary' FROM replayable.item_artifacts i"
        " JOIN replayable.artifacts a USING (stage, artifact_key) WHERE i.stage = 'summarize'",
    )
    assert len(summaries) == 6 and all(s.strip() for (s,) in summaries)

    paid = _paid(model)
    again = run_in_process({"source": str(folder), "stages": ALL})
    assert (again["to_do"], again["batches"]) == (0, 0)
    assert again["model_calls"]["calls"] == 0
    assert _paid(model) == paid
    assert_nothing_lost(conn)


def test_a_new_prompt_resummarises_every_document_and_reembeds_nothing(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 5)
    assert not run_in_process({"source": str(folder), "stages": ALL})["_failed"]
    embedded, summarised = _paid(model)
    texts = scalar(conn, "SELECT count(DISTINCT text_sha256) FROM replayable.extractions")

    edited = {"source": str(folder), "stages": ALL, "summary_prompt": "One line, please."}
    report = run_in_process(edited)
    assert not report["_failed"], report["_tasks"]
    assert report["to_do"] == 5
    assert report["stages"]["summarize"]["done"] == 5
    assert _paid(model) == (embedded, summarised + texts)
    assert report["model_calls_by_stage"] == {"summarize": texts}
    # The new prompt's summaries are current; the old ones stay stored, addressed by content.
    assert scalar(conn, "SELECT count(*) FROM replayable.artifacts") == 2 * texts
    assert_nothing_lost(conn, one_version=False)


def test_a_refusal_is_a_dead_letter_and_a_rerun_by_its_class_redoes_only_it(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 4)
    corpus.write_pdf(folder / "refused.pdf", ["Nobody may summarise the FORBIDDEN-TOPIC memo."])
    model.set_faults(chat_refusal_containing="FORBIDDEN-TOPIC")
    report = run_in_process({"source": str(folder), "stages": ALL})
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["summarize"]["done"] == 4
    assert report["stages"]["summarize"]["dead"] == 1
    assert report["stages"]["embed"]["done"] == 5  # the other branch is not held up
    assert rows(conn, "SELECT stage, error_class, attempts FROM replayable.dead_letters") == [
        ("summarize", "refused", 1)
    ]

    model.clear_faults()
    paid = _paid(model)
    rerun = {"rerun": {"stage": "summarize", "error_class": ["refused"], "status": ["dead"]}}
    again = run_in_process(rerun)
    assert not again["_failed"], again["_tasks"]
    assert again["documents"] == 1
    assert again["stages"]["summarize"]["done"] == 1
    assert _paid(model) == (paid[0], paid[1] + 1)  # that one summary, no embedding
    assert rows(conn, "SELECT status FROM replayable.dead_letters") == [("redriven",)]
    assert_nothing_lost(conn)
