"""PublishEventsOperator's arguments."""

from collections import defaultdict
from datetime import timedelta
from types import SimpleNamespace

import pytest

from replayable import DOCUMENTS_READY, DOCUMENTS_RETRACTED, PublishEventsOperator
from replayable.airflow import publisher
from replayable.outbox import PublishResult


def test_rendered_arguments_become_limits():
    op = PublishEventsOperator(task_id="p", max_events="20", batch_size=5, lease_s="90")
    limits = op.limits()
    assert (limits.max_events, limits.claim_size, limits.lease_s) == (20, 5, 90.0)
    assert op.outlets == [DOCUMENTS_READY, DOCUMENTS_RETRACTED]


def test_a_bad_argument_is_refused_naming_it():
    with pytest.raises(ValueError, match="batch_size"):
        PublishEventsOperator(task_id="p", batch_size="many").limits()
    with pytest.raises(ValueError, match="batch_size"):
        PublishEventsOperator(task_id="p", batch_size=0).limits()


def test_the_time_budget_is_an_argument():
    assert PublishEventsOperator(task_id="p", max_s="120").limits().max_s == 120.0


def test_a_time_budget_the_execution_timeout_would_cut_short_is_refused():
    op = PublishEventsOperator(task_id="p", max_s=1800, execution_timeout=timedelta(minutes=30))
    with pytest.raises(ValueError, match="max_s"):
        op.limits()


class _Ledger:
    def __init__(self, dsn: str) -> None:
        pass

    def transaction(self, fn, **kwargs):
        return fn(None)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("ready", [0, 3])
def test_a_task_that_announced_no_ready_document_succeeds_without_an_asset_event(
    monkeypatch, ready
):
    """Airflow records a skip only after the task's process exits (up to a second later) and
    a success at once, so the publish that ends an identical re-run succeeds; it drops its
    outlet instead, which the task runner reads after ``execute``."""
    monkeypatch.setattr(publisher, "connection_dsn", lambda conn_id: "dsn")
    monkeypatch.setattr(publisher.db, "Database", _Ledger)
    monkeypatch.setattr(publisher, "publish", lambda *args, **kwargs: PublishResult())
    counts = {"ready": ready, "retracted": 0, "events": ready + 2}
    monkeypatch.setattr(publisher, "publication_counts", lambda conn, publication: counts)
    op = PublishEventsOperator(task_id="publish", events_conn_id=None)
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="publish", map_index=-1, try_number=1)
    outlet_events: dict = defaultdict(SimpleNamespace)
    op.execute({"ti": ti, "outlet_events": outlet_events})
    if ready:
        assert op.outlets == [DOCUMENTS_READY]
        assert outlet_events[DOCUMENTS_READY].extra == {"publication": "d/r/publish", "ready": 3}
    else:
        assert op.outlets == []
        assert DOCUMENTS_READY not in outlet_events


@pytest.mark.parametrize(("ready", "retracted"), [(0, 2), (3, 2)])
def test_documents_that_left_the_index_are_announced_on_their_own_asset(
    monkeypatch, ready, retracted
):
    """document.deleted and document.updated events (ADR 0138) get an asset event of their
    own, naming the publication, beside the ready documents' one when there are any."""
    monkeypatch.setattr(publisher, "connection_dsn", lambda conn_id: "dsn")
    monkeypatch.setattr(publisher.db, "Database", _Ledger)
    monkeypatch.setattr(publisher, "publish", lambda *args, **kwargs: PublishResult())
    counts = {"ready": ready, "retracted": retracted, "events": ready + retracted}
    monkeypatch.setattr(publisher, "publication_counts", lambda conn, publication: counts)
    op = PublishEventsOperator(task_id="publish", events_conn_id=None)
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="publish", map_index=-1, try_number=1)
    outlet_events: dict = defaultdict(SimpleNamespace)
    op.execute({"ti": ti, "outlet_events": outlet_events})
    assert op.outlets == ([DOCUMENTS_READY] if ready else []) + [DOCUMENTS_RETRACTED]
    assert outlet_events[DOCUMENTS_RETRACTED].extra == {
        "publication": "d/r/publish",
        "retracted": 2,
    }
