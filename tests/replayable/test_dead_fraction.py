"""A failure threshold per run, ``max_dead_fraction`` (ADR 0116): when the documents this run
dead-lettered are more than that share of the documents it had work for, the report fails
the run, naming the fraction and the threshold; under it, the run succeeds and its report
lists its dead letters."""

from __future__ import annotations

import pytest

import corpus
from checks import assert_nothing_lost, subset
from replayable.pipeline import format_report
from replayable.settings import PipelineSettings


def _poisoned(tmp_path, model, clean: int):
    """``clean`` documents and one the provider refuses (a 400: dead at its first attempt)."""
    folder = subset(tmp_path, clean)
    corpus.write_pdf(folder / "poisoned.pdf", ["This text makes the provider answer POISON-400."])
    model.set_faults(fail_inputs_containing={"POISON-400": 400})
    return folder


def test_a_run_just_under_its_threshold_succeeds_and_lists_its_dead_letters(
    run_in_process, conn, model, tmp_path
):
    folder = _poisoned(tmp_path, model, 9)  # 1 dead of 10: 0.1
    report = run_in_process({"source": str(folder), "max_dead_fraction": 0.1})
    assert not report["_failed"], report["_tasks"]
    assert report["dead"]["documents"] == 1
    assert report["dead"]["fraction"] == pytest.approx(0.1)
    ((letter),) = report["dead"]["letters"]
    assert (letter["stage"], letter["error_class"]) == ("embed", "http_400")
    assert letter["uri"].endswith("poisoned.pdf")
    text = format_report(report)
    assert "dead letters: 1 of 10 documents (10.0%)" in text
    assert "poisoned.pdf" in text and "http_400" in text
    assert_nothing_lost(conn)


def test_a_run_just_over_its_threshold_fails_naming_the_fraction_and_the_threshold(
    monkeypatch,
):
    """The report task judges the report build_report wrote (as the run above, 1 of 10)."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from replayable import pipeline
    from replayable.airflow import tasks as dag_tasks
    from replayable.airflow.tasks import common

    report = {
        "run_id": "run-1",
        "documents": 10,
        "stages": {"embed": {"done": 9, "failed": 0, "dead": 1}},
        "model_calls": {"calls": 1, "ok": 1, "inputs": 3, "tokens": 30},
        "dead_letters_opened": 1,
        "dead": pipeline.dead_share(1, 10, []),
    }
    ti = SimpleNamespace(dag_id="document_pipeline", run_id="run-1")
    params = {"max_dead_fraction": 0.09}
    monkeypatch.setattr(common, "get_current_context", lambda: {"ti": ti, "params": params})
    monkeypatch.setattr(common, "on_database", lambda *a: report)
    with pytest.raises(AirflowFailException) as failed:
        dag_tasks.report()
    message = str(failed.value)
    assert "1 of 10 documents" in message and "0.1" in message
    assert "max_dead_fraction 0.09" in message
    params["max_dead_fraction"] = 0.1  # exactly at the threshold: not over it
    assert dag_tasks.report() is report
    params.pop("max_dead_fraction")  # no threshold: dead letters never fail the run
    assert dag_tasks.report() is report


@pytest.mark.parametrize("bad", [-0.1, 1.5, "half", True])
def test_a_threshold_outside_zero_to_one_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="max_dead_fraction: must be a number from 0 to 1"):
        PipelineSettings(max_dead_fraction=bad)
