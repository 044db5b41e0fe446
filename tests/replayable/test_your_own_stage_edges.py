"""Your own stage at its edges: what an ``ItemError`` means by default, and a stage that
cannot be built (ADR 0133)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from checks import rows, subset
from in_process import PipelineInProcess
from replayable import ArtifactStage, Document, Pipeline
from replayable.pipeline import format_report
from replayable.retry import ErrorKind, ItemError, classify
from replayable.stage import BuildContext
from replayable.stages.builtin import EXTRACT


@pytest.mark.parametrize(
    "error_class", ["rate_limited", "throttled", "timeout", "unavailable", "overloaded"]
)
def test_a_well_known_transient_class_is_retryable_by_default(error_class):
    assert classify(ItemError(error_class, "try later")).kind is ErrorKind.RETRYABLE


def test_any_other_class_is_terminal_by_default_and_an_explicit_kind_wins():
    assert ItemError("no_words", "never").kind is ErrorKind.TERMINAL
    assert ItemError("rate_limited", "x", ErrorKind.TERMINAL).kind is ErrorKind.TERMINAL
    assert ItemError("flaky", "x", kind=ErrorKind.RETRYABLE).kind is ErrorKind.RETRYABLE


def test_an_item_error_crosses_a_process_boundary_with_its_kind():
    import pickle

    again = pickle.loads(pickle.dumps(ItemError("rate_limited", "x")))  # noqa: S301 - our own
    assert (again.error_class, again.kind) == ("rate_limited", ErrorKind.RETRYABLE)


class Limited(ArtifactStage):
    """Refuses each document's first attempt with ``rate_limited``, as a user's API would."""

    name = "limited"
    attempts: ClassVar[list[int]] = []

    def process(self, document: Document) -> dict[str, Any]:
        Limited.attempts.append(document.attempt)
        if document.attempt == 1:
            raise ItemError("rate_limited", "the service asked us to slow down")
        return {"ok": True}


def test_a_rate_limited_item_is_retried_not_dead_lettered(
    run_in_process, monkeypatch, conn, tmp_path
):
    Limited.attempts.clear()
    run = PipelineInProcess(
        monkeypatch, pipeline=Pipeline("limited_pipeline", (EXTRACT, Limited()))
    )
    report = run({"source": str(subset(tmp_path, 1))})
    assert report["stages"]["limited"]["done"] == 1, report["_tasks"]
    assert sorted(Limited.attempts) == [1, 2]
    assert rows(conn, "SELECT count(*) FROM replayable.dead_letters") == [(0,)]


class Unbuildable(ArtifactStage):
    """Its ``build`` fails, as a stage whose client needs a setting that is missing."""

    name = "unbuildable"
    builds: ClassVar[int] = 0

    def build(self, ctx: BuildContext) -> Any:
        Unbuildable.builds += 1
        raise RuntimeError("the API key setting is empty")

    def process(self, document: Document) -> dict[str, Any]:
        raise AssertionError("never called")


def test_a_stage_that_cannot_be_built_fails_once_naming_itself_and_the_report_says_why(
    run_in_process, monkeypatch, tmp_path
):
    Unbuildable.builds = 0
    run = PipelineInProcess(
        monkeypatch, pipeline=Pipeline("unbuildable_pipeline", (EXTRACT, Unbuildable()))
    )
    report = run({"source": str(subset(tmp_path, 2))})
    assert report["_failed"]
    outcome = report["_tasks"]["batch.unbuildable", 0]
    assert (outcome.state, outcome.tries) == ("failed", 1)
    assert Unbuildable.builds == 1
    message = str(outcome.error)
    assert "unbuildable" in message and "the API key setting is empty" in message
    entry = report["stages"]["unbuildable"]
    assert entry["not_entered"] == 2
    assert entry["errors"] == {"stage_build": 2}
    assert (
        "could not be built" in entry["not_built"]
        and "the API key setting is empty" in entry["not_built"]
    )
    line = next(x for x in format_report(report).splitlines() if x.startswith("unbuildable"))
    assert "stage_build=2" in line
