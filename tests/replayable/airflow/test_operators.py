import json
from contextlib import ExitStack
from datetime import timedelta

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction

from helpers.ledger import flaky_connect
from replayable import db, pipeline
from replayable.airflow import hooks
from replayable.airflow.operators import (
    BatchIncompleteError,
    BatchRetryPolicy,
    IdempotentStageOperator,
    SystemicFailureError,
)
from replayable.retry import CallRetry, Classified, ErrorKind
from replayable.settings import DEFAULT_MAX_IN_FLIGHT, PipelineSettings
from replayable.stage import BuildContext
from replayable.stages import builtin
from replayable.vocabulary import MODEL_CONN_ID

POLICY = BatchRetryPolicy()


def decide(exc):
    return POLICY.evaluate(exc, try_number=1, max_tries=4)


@pytest.mark.parametrize("status", ["http_401", "http_403"])
def test_auth_failures_fail_the_task_without_retrying(status):
    decision = decide(SystemicFailureError(Classified(status, ErrorKind.SYSTEMIC, "no")))
    assert decision.action is RetryAction.FAIL


def test_the_retry_waits_for_the_largest_retry_after():
    decision = decide(BatchIncompleteError("2 failed", retry_after_s=42.0))
    assert (decision.action, decision.retry_delay) == (RetryAction.RETRY, timedelta(seconds=42))


def test_a_provider_outage_retries_after_its_retry_after():
    error = Classified("provider_unavailable", ErrorKind.SYSTEMIC, "down", retry_after_s=30)
    decision = decide(SystemicFailureError(error))
    assert (decision.action, decision.retry_delay) == (RetryAction.RETRY, timedelta(seconds=30))


def test_without_retry_after_the_task_keeps_its_own_retry_delay():
    assert decide(BatchIncompleteError("1 failed")).action is RetryAction.DEFAULT
    assert decide(RuntimeError("bug")).action is RetryAction.DEFAULT


def test_an_unknown_stage_is_rejected_naming_it():
    with pytest.raises(ValueError, match="ocr"):
        IdempotentStageOperator(task_id="x", stage="ocr", batch=[])


def test_the_operator_brings_its_retry_policy():
    op = IdempotentStageOperator(task_id="x", stage="chunk", batch={"doc_ids": ["a"]})
    assert isinstance(op.retry_policy, BatchRetryPolicy)
    assert op.doc_ids("unused", "d", "r") == ["a"]


def test_a_huge_retry_after_is_capped_by_max_retry_after_s():
    """Retry-After: 31536000 must not park a task for a year."""
    from replayable.runner import BatchResult
    from replayable.settings import PipelineSettings

    op = IdempotentStageOperator(task_id="x", stage="embed", batch={"doc_ids": ["a"]})
    result = BatchResult("embed", failed=["a"], retry_after_s=31_536_000)
    with pytest.raises(BatchIncompleteError) as info:
        op._outcome(result, PipelineSettings(max_retry_after_s=300), 1.0)
    decision = decide(info.value)
    assert decision.retry_delay == timedelta(seconds=300)


class _RecordingStats:
    """A stats backend that keeps every call, installed through the SDK's own initialize()."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, object, dict]] = []

    def incr(self, stat, count=1, rate=1, *, tags=None):
        self.calls.append(("incr", stat, count, tags or {}))

    def timing(self, stat, dt, *, tags=None):
        self.calls.append(("timing", stat, dt, tags or {}))


def test_a_batch_emits_airflow_metrics_tagged_with_its_stage(monkeypatch):
    from airflow.sdk._shared.observability.metrics import stats as backend_state
    from airflow.sdk.observability import stats

    from replayable.runner import BatchResult
    from replayable.settings import PipelineSettings

    for name in ("_factory", "_backend", "_export_legacy_names"):
        monkeypatch.setattr(backend_state, name, getattr(backend_state, name))
    recorder = _RecordingStats()
    stats.initialize(factory=lambda: recorder, export_legacy_names=False)
    op = IdempotentStageOperator(task_id="x", stage="embed", batch={"doc_ids": ["a"]})
    result = BatchResult(stage="embed", done=["a", "b", "c"], dead=["d"])
    op._outcome(result, PipelineSettings.from_params({}), 2.5)
    tags = {"stage": "embed"}
    assert recorder.calls == [
        ("incr", "replayable.items.done", 3, tags),
        ("incr", "replayable.items.dead", 1, tags),
        ("timing", "replayable.batch.duration", timedelta(seconds=2.5), tags),
    ]


def test_a_batch_past_its_deadline_is_retried_not_failed():
    error = Classified("deadline", ErrorKind.SYSTEMIC, "past this run's deadline")
    assert decide(SystemicFailureError(error)).action is RetryAction.DEFAULT


def test_a_request_may_hold_its_chunks_for_as_long_as_a_healthy_call_lasts(monkeypatch):
    """The embed stage's bound on idle request transactions covers every retry and wait of a
    call plus its last request, with slack: only an abandoned request loses its locks."""
    connection = {"conn_type": "http", "host": "http://127.0.0.1:9/v1", "extra": {"timeout_s": 7}}
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_MODEL", json.dumps(connection))
    spec = embed_spec_for(PipelineSettings())
    assert spec.max_call_s == CallRetry().max_total_s + 7 + builtin.CALL_SLACK_S


def test_a_batch_that_starts_during_a_database_restart_waits_for_it(monkeypatch):
    """Reading the batch's documents rides out a restart instead of failing the task's try."""
    monkeypatch.setattr(db, "connect", flaky_connect(2))
    monkeypatch.setattr(pipeline, "batch_doc_ids", lambda conn, **where: ["a", "b"])
    op = IdempotentStageOperator(task_id="x", stage="chunk", batch={"index": 0})
    assert op.doc_ids("dsn", "d", "r") == ["a", "b"]


def model_connection(monkeypatch, **extra):
    connection = {"conn_type": "http", "host": "http://127.0.0.1:9/v1", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_MODEL", json.dumps(connection))


def embed_spec_for(settings):
    """The embed stage as a task builds it under ``settings`` (its budget is not opened)."""
    with ExitStack() as stack:
        context = BuildContext(
            settings=settings,
            run_id="run",
            documents=1,
            connect=lambda: None,
            stack=stack,
            spec_hashes={},
            model_conn_id=MODEL_CONN_ID,
            model_provider=hooks.ModelHook(MODEL_CONN_ID).get_settings,
        )
        return builtin.EMBED.build(context)


def test_a_conf_may_lower_the_connections_limits_but_never_raise_them(monkeypatch):
    """Invariant 15: max_in_flight and max_rps from a run's conf only tighten."""
    model_connection(monkeypatch, max_in_flight=4, max_rps=10)
    loose = hooks.choice_of(PipelineSettings(max_in_flight=64, max_rps=500), "replayable_model")
    assert (loose.max_in_flight, loose.max_rps) == (4, 10)
    tight = hooks.choice_of(PipelineSettings(max_in_flight=2, max_rps=3), "replayable_model")
    assert (tight.max_in_flight, tight.max_rps) == (2, 3)


def test_a_conf_cannot_raise_the_default_in_flight_limit_of_a_connection_without_one(monkeypatch):
    model_connection(monkeypatch)
    choice = hooks.choice_of(PipelineSettings(max_in_flight=256), "replayable_model")
    assert choice.max_in_flight == DEFAULT_MAX_IN_FLIGHT


def test_the_shared_budget_is_always_counted_against_the_connections_values(monkeypatch):
    """A run that asks for less sends less itself, but the slots and the rate everyone
    shares are the connection's, so runs with different confs count against one budget."""
    model_connection(monkeypatch, max_in_flight=8, max_rps=20, max_tpm=90_000)
    mine = embed_spec_for(PipelineSettings(max_in_flight=2, max_rps=5))
    theirs = embed_spec_for(PipelineSettings())
    # Tokens a minute are the connection's alone; a request carries at most a minute's
    # share of one of its 8 slots.
    assert mine.budget.max_tpm == theirs.budget.max_tpm == 90_000
    assert mine.request_tokens == theirs.request_tokens == 11_250
    assert mine.max_in_flight == 2
    assert (mine.budget.name, mine.budget.slots, mine.budget.max_rps) == (
        theirs.budget.name,
        8,
        20,
    )
    assert mine.budget.own_rps == 5 and theirs.budget.own_rps is None
