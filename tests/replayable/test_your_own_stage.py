"""A stage defined here, not in the package, in a pipeline of its own: every guarantee holds.

The pipeline (extract, then ``wordcount``, a stage of this file that reads the text, then
``shout``, one that reads wordcount's output) runs its DAG's own tasks in this process
against the real Postgres (tests/in_process.py), sharing the ledger with document_pipeline.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, ClassVar

import pytest

import corpus
from checks import (
    README_EXAMPLE_DAG,
    paste_readme_example,
    rows,
    scalar,
    scrape_metrics,
    subset,
)
from in_process import PipelineInProcess
from replayable import ArtifactStage, Document, Pipeline
from replayable.retry import ItemError
from replayable.stages.builtin import EXTRACT

POISON = "POISON-WORDS"


class WordCount(ArtifactStage):
    """Counts the words of each document's text; a poisoned text is a terminal error."""

    name = "wordcount"
    version = "1.0"
    seen: ClassVar[list[str]] = []  # every document process() was called for
    fixed: ClassVar[bool] = False  # a later version that can read poisoned texts

    def process(self, document: Document) -> dict[str, Any]:
        WordCount.seen.append(document.doc_id)
        text = document.text or ""
        if POISON in text and not WordCount.fixed:
            raise ItemError("poisoned", "the text carries the poison marker")
        return {"words": len(text.split())}


class Shout(ArtifactStage):
    """Reads wordcount's output: a stage on a stage of your own."""

    name = "shout"
    reads = "wordcount"
    last = True
    seen: ClassVar[list[str]] = []

    def process(self, document: Document) -> dict[str, Any]:
        Shout.seen.append(document.doc_id)
        assert document.data is not None
        return {"loud": document.data["words"] * 2}


PIPELINE = Pipeline("my_pipeline", (EXTRACT, WordCount(), Shout()))


@pytest.fixture
def run_mine(run_in_process, monkeypatch) -> PipelineInProcess:
    WordCount.seen.clear()
    Shout.seen.clear()
    monkeypatch.setattr(WordCount, "fixed", False)
    return PipelineInProcess(monkeypatch, pipeline=PIPELINE)


def test_the_readmes_example_pasted_into_a_dag_file_is_found_and_runs_as_written(
    run_in_process, monkeypatch, conn, tmp_path
):
    """Parsed by Airflow's own DagBag (in safe mode, as a stock Airflow parses dags/), then
    run: its stage does the work and announces each document; the same code again does
    nothing."""
    from airflow.models import DagBag

    from replayable.pipeline.registry import pipeline_of

    path = paste_readme_example(tmp_path / "dags")
    bag = DagBag(dag_folder=str(path), safe_mode=True)
    assert bag.import_errors == {}
    assert README_EXAMPLE_DAG in bag.dag_ids
    run = PipelineInProcess(monkeypatch, pipeline=pipeline_of(README_EXAMPLE_DAG))
    folder = subset(tmp_path, 2)
    report = run({"source": str(folder)})
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["top_words"]["done"] == 2
    assert rows(
        conn,
        "SELECT version LIKE 'auto-%%' FROM replayable.stage_versions WHERE stage = 'top_words'",
    ) == [(True,)]
    events = rows(conn, "SELECT payload->>'stage', count(*) FROM replayable.outbox GROUP BY 1")
    assert events == [("top_words", 2)]
    assert run({"source": str(folder)})["to_do"] == 0


def test_the_first_run_does_the_work_and_an_identical_one_nothing(run_mine, conn, tmp_path):
    folder = subset(tmp_path, 5)
    first = run_mine({"source": str(folder)})
    assert not first["_failed"], first["_tasks"]
    assert [first["stages"][s]["done"] for s in ("extract", "wordcount", "shout")] == [5, 5, 5]
    assert len(WordCount.seen) == len(Shout.seen) == 5
    outputs = rows(
        conn,
        "SELECT i.stage, (a.data->>'loud')::int > 0 FROM replayable.item_artifacts i"
        " JOIN replayable.artifacts a USING (stage, artifact_key) WHERE i.stage = 'shout'",
    )
    assert outputs == [("shout", True)] * 5
    # Each document announced once, by the last stage.
    assert (
        scalar(conn, "SELECT count(*) FROM replayable.outbox WHERE event_type = 'document.ready'")
        == 5
    )

    again = run_mine({"source": str(folder)})
    assert (again["to_do"], again["batches"]) == (0, 0)
    assert len(WordCount.seen) == len(Shout.seen) == 5  # not called again
    assert scalar(conn, "SELECT count(*) FROM replayable.outbox") == 5


def test_a_poisoned_document_is_dead_and_a_rerun_of_its_class_redoes_only_it(
    run_mine, conn, tmp_path
):
    folder = subset(tmp_path, 3)
    corpus.write_pdf(folder / "poisoned.pdf", [f"This document carries {POISON} inside it."])
    first = run_mine({"source": str(folder)})
    assert not first["_failed"], first["_tasks"]
    assert first["stages"]["wordcount"]["done"] == 3
    assert first["stages"]["wordcount"]["dead"] == 1
    assert first["stages"]["shout"]["done"] == 3  # its input never came: not entered
    assert rows(conn, "SELECT stage, error_class, attempts FROM replayable.dead_letters") == [
        ("wordcount", "poisoned", 1)
    ]

    WordCount.fixed = True
    WordCount.seen.clear()
    Shout.seen.clear()
    rerun = {"rerun": {"stage": "wordcount", "error_class": ["poisoned"], "status": ["dead"]}}
    again = run_mine(rerun)
    assert not again["_failed"], again["_tasks"]
    assert again["documents"] == 1
    assert (again["stages"]["wordcount"]["done"], again["stages"]["shout"]["done"]) == (1, 1)
    assert len(WordCount.seen) == len(Shout.seen) == 1
    assert rows(conn, "SELECT status FROM replayable.dead_letters") == [("redriven",)]


def test_a_redrive_of_its_letters_finishes_them(run_mine, conn, tmp_path):
    folder = subset(tmp_path, 2)
    corpus.write_pdf(folder / "poisoned.pdf", [f"Again {POISON} here."])
    assert run_mine({"source": str(folder)})["stages"]["wordcount"]["dead"] == 1
    WordCount.fixed = True
    redrive = {"redrive": {"stage": "wordcount", "reason": "the stage reads it now"}}
    report = run_mine(redrive)
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["shout"]["done"] == 1
    assert rows(conn, "SELECT status, resolved_by FROM replayable.dead_letters") == [
        ("redriven", "tester")
    ]


def test_two_pipelines_share_the_ledger_and_the_extraction_without_colliding(
    run_mine, run_in_process, conn, tmp_path
):
    folder = subset(tmp_path, 3)
    assert not run_in_process({"source": str(folder), "stages": ["extract"]})["_failed"]
    extractions = scalar(conn, "SELECT count(*) FROM replayable.extractions")
    mine = run_mine({"source": str(folder)})
    assert not mine["_failed"], mine["_tasks"]
    # The extraction was done under the same key: not read again, and not redone.
    assert scalar(conn, "SELECT count(*) FROM replayable.extractions") == extractions
    assert mine["stages"]["wordcount"]["done"] == 3
    stages = dict(rows(conn, "SELECT stage, count(*) FROM replayable.stage_runs GROUP BY 1"))
    assert stages == {"extract": 3, "wordcount": 3, "shout": 3}


def test_its_stages_appear_in_the_cli_the_ui_the_metrics_and_the_events(
    run_mine, conn, dsn, tmp_path, capsys, monkeypatch
):
    """No edit to the package: the stage names come from the ledger and the pipeline."""
    from replayable.cli import main

    folder = subset(tmp_path, 2)
    corpus.write_pdf(folder / "poisoned.pdf", [f"And {POISON} once more."])
    run = run_mine({"source": str(folder)})
    assert not run["_failed"], run["_tasks"]

    capsys.readouterr()  # what the run printed
    # The CLI: status per stage, overall and for the run.
    for extra in ((), ("--run", run["run_id"])):
        assert main(["--dsn", dsn, "--json", "status", *extra]) == 0
        stages = {s["stage"]: s for s in json.loads(capsys.readouterr().out)["stages"]}
        assert stages["wordcount"]["done"] == 2 and stages["wordcount"]["dead"] == 1
        assert stages["shout"]["done"] == 2
    assert main(["--dsn", dsn, "--json", "dead-letters", "--stage", "wordcount"]) == 0
    letters = json.loads(capsys.readouterr().out)
    assert [letter["error_class"] for letter in letters["dead_letters"]] == ["poisoned"]

    # The metrics, labelled by its stages (the UI's pages: tests/replayable/web/test_filters).
    samples = scrape_metrics(dsn, monkeypatch)
    assert samples[("replayable_items", (("stage", "wordcount"), ("status", "done")))] == 2
    assert samples[("replayable_dead_letters_open", (("stage", "wordcount"),))] == 1

    # The outbox: each finished document announced by the last stage, the dead one by its.
    events = rows(conn, "SELECT event_type, payload->>'stage' FROM replayable.outbox ORDER BY 1")
    assert events == [
        ("document.failed", "wordcount"),
        ("document.ready", "shout"),
        ("document.ready", "shout"),
    ]


def test_a_stage_that_does_not_say_how_it_processes_cannot_be_made():
    """The definition is refused when the DAG file is parsed, not when a task first runs."""

    class Unfinished(ArtifactStage):
        name = "unfinished"

    with pytest.raises(TypeError, match="process"):
        Unfinished()


class Frozen(ArtifactStage):
    """Its first caller freezes (until ``thawed``) while it holds its output's lock."""

    name = "frozen"
    max_item_s = 0.5
    thawed: ClassVar[threading.Event] = threading.Event()
    first: ClassVar[list[str]] = []
    lock: ClassVar[threading.Lock] = threading.Lock()
    woken_by_peer: ClassVar[list[bool]] = []  # False: the wait timed out

    def process(self, document: Document) -> dict[str, Any]:
        with Frozen.lock:
            first = not Frozen.first
            Frozen.first.append(document.doc_id)
        if first:
            Frozen.woken_by_peer.append(Frozen.thawed.wait(timeout=15))
        return {"chars": len(document.text or "")}


def test_a_worker_frozen_in_process_holds_no_peer_past_max_item_s(conn, dsn):
    """Two documents with one text, in two workers: the first freezes inside process. After
    max_item_s its session ends, and with it its lock on the output; the peer computes the
    output and finishes while the first is still frozen, and the first then finishes too."""
    from checks import seed_extraction
    from replayable import db
    from replayable.ledger import RunContext
    from replayable.runner import run_batch
    from replayable.stage import BuildContext, Models

    text = "The same words in two documents, read by a stage that freezes once."
    docs = ["e" * 64, "f" * 64]
    for doc_id in docs:
        seed_extraction(conn, doc_id, f"/docs/{doc_id[0]}.pdf", text)
    conn.commit()
    Frozen.thawed.clear()
    Frozen.first.clear()
    Frozen.woken_by_peer.clear()
    results = {}

    def connect() -> db.Database:
        return db.Database(dsn, outage_s=30)

    def work(doc_id: str) -> None:
        from contextlib import ExitStack

        from replayable.settings import PipelineSettings

        with ExitStack() as stack:
            spec = Frozen().build(
                BuildContext(
                    settings=PipelineSettings(),
                    run_id="r",
                    documents=1,
                    connect=connect,
                    stack=stack,
                    spec_hashes={"extract": "x"},
                    model_conn_id="unused",
                    models=Models(),
                )
            )
            results[doc_id] = run_batch(
                spec, [doc_id], connect=connect, ctx=RunContext(owner=doc_id[0], run_id="r")
            )
        if Frozen.first[0] != doc_id:
            Frozen.thawed.set()  # the peer is done: let the frozen worker go on

    first = threading.Thread(target=work, args=(docs[0],))
    first.start()
    while not Frozen.first:
        time.sleep(0.01)
    peer = threading.Thread(target=work, args=(docs[1],))
    peer.start()
    peer.join(timeout=30)
    first.join(timeout=30)
    assert Frozen.woken_by_peer == [True]  # the peer finished while the first was frozen
    assert all(results[d].done == [d] for d in docs), results
    assert rows(conn, "SELECT count(*) FROM replayable.artifacts WHERE stage = 'frozen'") == [(1,)]
