"""Limits.deadline_s: past the run's deadline a batch stops and gives its unfinished items back."""

import threading
import time

import pytest

from helpers.runner import ItemPerDocument, count, run, seed_documents
from replayable import db
from replayable.keys import config_hash
from replayable.ledger import Ledger, RunContext
from replayable.runner import DEADLINE, Limits, StageSpec, spec_hash

pytestmark = pytest.mark.db


class _OneSecondEach(ItemPerDocument):
    """A stage that takes a second per item and starts none once the batch is stopping."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def process(self, items, io):
        for item in items:
            if io.stopping:
                return
            self.started.append(item.doc_id)
            time.sleep(1.0)
            io.done(item)


class _FirstUntilStopped(_OneSecondEach):
    """A stage whose first item runs until the batch is stopping (for a minute at most)."""

    def process(self, items, io):
        for item in items:
            if io.stopping:
                return
            self.started.append(item.doc_id)
            give_up = time.monotonic() + 60
            while not io.stopping and time.monotonic() < give_up:
                time.sleep(0.01)
            io.done(item)


def test_past_the_deadline_the_batch_stops_and_releases_what_is_left(conn, dsn):
    """The item in flight when the deadline passes finishes; none starts after it."""
    doc_ids = seed_documents(conn, 5)
    stage = _FirstUntilStopped()
    result = run(stage, dsn, doc_ids, deadline_s=2)
    # Only the deadline stops the first item: without it, the batch would run every item.
    assert result.systemic is not None and result.systemic.error_class == DEADLINE
    assert len(stage.started) == 1 and result.done == stage.started
    assert sorted(result.failed) == sorted(set(doc_ids) - set(stage.started))
    # Released, not failed: no attempt spent and no dead letter.
    left = "SELECT max(attempts) FROM replayable.stage_runs WHERE status <> 'done'"
    assert count(conn, left) == 0
    assert count(conn, "SELECT count(*) FROM replayable.dead_letters") == 0


def test_a_batch_within_its_deadline_is_untouched(conn, dsn):
    doc_ids = seed_documents(conn, 2)
    result = run(_OneSecondEach(), dsn, doc_ids, deadline_s=30)
    assert result.systemic is None and sorted(result.done) == doc_ids


def test_a_deadline_must_be_positive():
    with pytest.raises(ValueError, match="deadline_s"):
        Limits(deadline_s=0)


def test_a_stage_with_a_deadline_keeps_announcing_ready_documents():
    """The last_stage flag is the spec's own, or no document.ready would be written."""
    from replayable.runner import ready_versions

    class Last(StageSpec):
        name, code_version, last_stage = "embed", "1", True

        def lineage(self):
            return {}

    assert ready_versions(Last()) == {"stage": "embed", "code_version": "1"}
    assert ready_versions(_OneSecondEach()) is None


def test_waiting_for_another_runs_leases_ends_at_this_runs_deadline(conn, dsn):
    """Items another worker holds are waited for only until the deadline, not their lease."""
    doc_ids = seed_documents(conn, 3)
    stage = _OneSecondEach()
    # Another run holds every item, with a lease that outlasts this run's deadline by far.
    other = Ledger(
        db.Database(dsn),
        stage.name,
        stage.code_version,
        config_hash({}),
        spec_hash(stage),
        RunContext(owner="other-run", run_id="other"),
        lease_s=120,
    )
    other.claim([(f"slow-{d}", d) for d in doc_ids])
    results = []
    waiter = threading.Thread(
        target=lambda: results.append(run(stage, dsn, doc_ids, deadline_s=1.0)),
        daemon=True,
    )
    waiter.start()
    waiter.join(timeout=30)
    other.db.close()
    assert results, "the batch waited past its deadline for another run's leases"
    (result,) = results
    assert result.systemic is not None and result.systemic.error_class == DEADLINE
    assert stage.started == [] and result.done == []
    # The other run's leases are untouched: its items are still its own.
    held = "SELECT count(*) FROM replayable.stage_runs WHERE lease_owner = 'other-run'"
    assert count(conn, held) == 3
    assert Limits().deadline_s is None
