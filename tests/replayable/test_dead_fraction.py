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
    run_in_process, conn, model, tmp_path
):
    folder = _poisoned(tmp_path, model, 9)
    report = run_in_process({"source": str(folder), "max_dead_fraction": 0.09})
    assert report["_failed"]
    outcome = report["_tasks"]["report", -1]
    assert outcome.state == "failed"
    message = str(outcome.error)
    assert "1 of 10 documents" in message and "0.1" in message
    assert "max_dead_fraction 0.09" in message
    # Every other item finished: the threshold judges the run, it loses nothing.
    assert report["stages"]["embed"]["done"] == 9
    assert_nothing_lost(conn)


def test_without_a_threshold_dead_letters_never_fail_the_run(run_in_process, conn, model, tmp_path):
    folder = _poisoned(tmp_path, model, 1)  # half the run dies
    report = run_in_process({"source": str(folder)})
    assert not report["_failed"], report["_tasks"]
    assert report["dead"]["fraction"] == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [-0.1, 1.5, "half", True])
def test_a_threshold_outside_zero_to_one_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="max_dead_fraction: must be a number from 0 to 1"):
        PipelineSettings(max_dead_fraction=bad)
