"""keyword_pipeline, the example of a stage of your own, announces what it finishes."""

from __future__ import annotations

import runpy

from checks import rows, subset
from helpers import ROOT
from in_process import PipelineInProcess
from replayable import DOCUMENTS_READY
from replayable.pipeline.registry import pipeline_of


def test_keyword_pipeline_announces_each_document_it_finishes(
    run_in_process, monkeypatch, conn, tmp_path
):
    """Its final stage, keywords, says nothing of ``last``: it announces by default, through
    the outbox and the publish task's asset event."""
    monkeypatch.syspath_prepend(str(ROOT / "dags"))  # as Airflow does for a bundle's modules
    runpy.run_path(str(ROOT / "dags" / "keyword_pipeline.py"))
    run = PipelineInProcess(monkeypatch, pipeline=pipeline_of("keyword_pipeline"))
    report = run({"source": str(subset(tmp_path, 3))})
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["keywords"]["done"] == 3
    events = rows(
        conn,
        "SELECT event_type, payload->>'stage', payload->>'dag_id', count(*)"
        " FROM replayable.outbox GROUP BY 1, 2, 3",
    )
    assert events == [("document.ready", "keywords", "keyword_pipeline", 3)]
    assert run.outlets[DOCUMENTS_READY].extra["ready"] == 3
