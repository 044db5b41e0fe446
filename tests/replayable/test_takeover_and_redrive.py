"""The claim's paths that no item outcome walks: a takeover at the attempt cap, and a redrive.

An item whose task is killed never reports an outcome, so the attempt cap must hold when the
next worker takes it over (ADR 0084). A redrive's selection must be the same however often
its ``plan`` runs, and its letters close only when their items are taken (ADR 0083).
"""

import json
import time

import pytest

from checks import rows
from helpers.runner import ItemPerDocument
from replayable import db, pipeline
from replayable.ledger import Ledger, Outcome, Revival, RunContext
from replayable.retry import Classified, ErrorKind
from replayable.settings import PipelineSettings
from replayable.stages.chunk.chunker import chunk_config_of
from replayable.stages.lineage import spec_hashes

pytestmark = pytest.mark.db

DOCS = [f"{i:x}" * 64 for i in range(1, 5)]
HASHES = spec_hashes(chunk_config_of(PipelineSettings()), "m", None)
TERMINAL = Classified("http_400", ErrorKind.TERMINAL, "bad input")


def reopen_letters(conn):
    """Open every letter again, as a ledger written before ADR 0132 may hold them."""
    rows(
        conn,
        "UPDATE replayable.dead_letters SET status = 'open', resolved_at = NULL,"
        " resolved_by = NULL, resolution = NULL, resolved_dag_id = NULL,"
        " resolved_run_id = NULL RETURNING id",
    )


def ledger(database, stage="embed", owner="w1", lease_s=60.0, max_attempts=3, **ctx):
    return Ledger(
        database,
        stage,
        "1.0",
        "cfg",
        HASHES[stage],
        RunContext(owner=owner, **{"dag_id": "d", "run_id": "r1", **ctx}),
        lease_s=lease_s,
        max_attempts=max_attempts,
    )


# -- the attempt cap on a takeover ---------------------------------------------------------


def test_an_item_that_kills_its_task_at_every_try_ends_dead_as_killed(conn, database, docs):
    """Tries 1-3 each take the item and die; try 4 finds it at the cap and dead-letters it."""
    for try_number in (1, 2, 3):
        taker = ledger(database, owner=f"try{try_number}", map_index=0, try_number=try_number)
        states = taker.claim([("k", DOCS[0])])
        assert states["k"].mine
        if states["k"].unstarted:  # taken over: the runner starts it just before its work
            assert taker.start(["k"]) == {"k": try_number}
        # ...and the task is killed here
    fourth = ledger(database, owner="try4", map_index=0, try_number=4).claim([("k", DOCS[0])])
    assert fourth["k"].status == "dead" and not fourth["k"].mine
    assert rows(
        conn, "SELECT status, attempts, error_class, lease_owner FROM replayable.stage_runs"
    ) == [("dead", 3, "killed", None)]
    (letter,) = rows(
        conn,
        "SELECT error_class, error_kind, attempts, run_id, map_index, try_number, error"
        " FROM replayable.dead_letters WHERE status = 'open'",
    )
    assert letter[:6] == ("killed", "terminal", 3, "r1", 0, 3)
    assert "last held by try3" in letter[6] and "try 3" in letter[6]
    (event,) = rows(conn, "SELECT event_type, payload FROM replayable.outbox")
    assert event[0] == "document.failed"
    assert event[1]["error_class"] == "killed" and event[1]["doc_id"] == DOCS[0]


def test_an_expired_lease_at_the_cap_is_dead_lettered_not_taken_over(conn, database, docs):
    """Another worker finding an orphaned item at its cap ends it; below the cap it takes it."""
    first = ledger(database, owner="w1", lease_s=0.05, max_attempts=2)
    first.claim([("a", DOCS[0])])
    time.sleep(0.1)
    second = ledger(database, owner="w2", lease_s=0.05, max_attempts=2)
    taken = second.claim([("a", DOCS[0])])["a"]
    assert taken.mine and taken.unstarted and taken.attempts == 1
    assert second.start(["a"]) == {"a": 2}
    time.sleep(0.1)
    third = ledger(database, owner="w3", max_attempts=2).claim([("a", DOCS[0])])
    assert third["a"].status == "dead"
    assert rows(conn, "SELECT error_class, attempts FROM replayable.dead_letters") == [
        ("killed", 2)
    ]
    # The counters follow the transition as they follow a finish.
    assert rows(
        conn,
        "SELECT status, error_class, sum(n)::int FROM replayable.stage_counts"
        " GROUP BY 1, 2 HAVING sum(n) <> 0",
    ) == [("dead", "killed", 1)]


def test_a_live_lease_at_the_cap_is_left_alone(conn, database, docs):
    ledger(database, owner="w1", max_attempts=1).claim([("a", DOCS[0])])
    again = ledger(database, owner="w2", max_attempts=1).claim([("a", DOCS[0])])
    assert again["a"].status == "running" and not again["a"].mine
    assert rows(conn, "SELECT count(*) FROM replayable.dead_letters") == [(0,)]


def test_a_killed_letter_can_be_redriven_with_a_fresh_budget(conn, database, docs):
    for try_number in (1, 2):
        ledger(database, owner=f"t{try_number}", max_attempts=1, try_number=try_number).claim(
            [("a", DOCS[0])]
        )
    assert rows(conn, "SELECT status FROM replayable.stage_runs") == [("dead",)]
    revived = ledger(database, owner="fixed", max_attempts=1, run_id="r2").claim(
        [("a", DOCS[0])], revive=Revival(by="ana", reason="more memory")
    )
    assert revived["a"].mine and revived["a"].attempts == 1
    assert rows(conn, "SELECT status, resolved_by FROM replayable.dead_letters") == [
        ("redriven", "ana")
    ]


# -- a redrive whose plan runs more than once ----------------------------------------------


def dead_in_embed(conn, database, doc_ids):
    """Give ``doc_ids`` an open embed letter each (terminal), the other stages done."""
    for stage in ("extract", "chunk"):
        done = ledger(database, stage=stage)
        done.claim([(f"{stage}-{d}", d) for d in doc_ids])
        database.transaction(
            lambda c, done=done, stage=stage: done.finish(
                c, [Outcome.done(f"{stage}-{d}") for d in doc_ids]
            )
        )
    embed = ledger(database)
    embed.claim([(f"embed-{d}", d) for d in doc_ids])
    database.transaction(
        lambda c: embed.finish(c, [Outcome(f"embed-{d}", "failed", TERMINAL) for d in doc_ids])
    )


def plan(conn, settings, run_id="rd"):
    pipeline.select_documents(conn, settings, dag_id="d", run_id=run_id)
    return pipeline.plan_batches(
        conn, settings, dag_id="d", run_id=run_id, spec_hashes=HASHES, revived_by="ana"
    )


REDRIVE = PipelineSettings(redrive={"stage": "embed", "reason": "provider fixed", "by": "bob"})


def test_a_redrive_whose_plan_runs_twice_still_finds_every_letter(conn, database, docs):
    dead_in_embed(conn, database, DOCS[:3])
    first = plan(conn, REDRIVE)
    assert sum(b["size"] for b in first) == 3
    assert rows(conn, "SELECT count(*) FROM replayable.dead_letters WHERE status = 'open'") == [
        (3,)
    ]
    # plan is retried (or its transaction replayed): the same documents, the same batches.
    assert plan(conn, REDRIVE) == first


def test_a_redrive_closes_a_letter_only_when_its_item_is_taken_and_a_later_plan_keeps_it(
    conn, database, docs
):
    dead_in_embed(conn, database, DOCS[:3])
    plan(conn, REDRIVE)
    revive = Revival(by="ana", reason="provider fixed (run rd; note: bob)")
    taker = ledger(database, owner="batch0", run_id="rd")
    states = taker.claim([(f"embed-{d}", d) for d in DOCS[:2]], revive=revive)
    assert all(states[f"embed-{d}"].mine for d in DOCS[:2])
    assert rows(
        conn,
        "SELECT doc_id, status, resolved_by, resolved_run_id FROM replayable.dead_letters"
        " ORDER BY doc_id",
    ) == [
        (DOCS[0], "redriven", "ana", "rd"),
        (DOCS[1], "redriven", "ana", "rd"),
        (DOCS[2], "open", None, None),
    ]
    # The third item was not taken yet; a plan that runs again now still covers all three.
    assert pipeline.select_documents(conn, REDRIVE, dag_id="d", run_id="rd") == 3


def test_a_redrive_that_leaves_out_its_stage_closes_nothing(conn, database, docs):
    dead_in_embed(conn, database, DOCS[:2])
    skipping = PipelineSettings(
        stages=("extract", "chunk"), redrive={"stage": "embed", "reason": "provider fixed"}
    )
    assert plan(conn, skipping) == []
    assert rows(conn, "SELECT count(*) FROM replayable.dead_letters WHERE status = 'open'") == [
        (2,)
    ]


def test_the_redrive_note_never_replaces_the_triggering_user(conn, database, docs):
    """``redrive.by`` is a note in the resolution; the actor is who triggered the run."""
    from replayable.airflow.operators import revival_reason

    dead_in_embed(conn, database, DOCS[:1])
    plan(conn, REDRIVE)
    reason = revival_reason(REDRIVE, "rd")
    assert reason == "provider fixed (run rd; note: bob)"
    ledger(database, run_id="rd").claim(
        [(f"embed-{DOCS[0]}", DOCS[0])], revive=Revival(by="op-user", reason=reason)
    )
    assert rows(conn, "SELECT actor FROM replayable.dead_letter_history") == [("op-user",)]
    assert rows(conn, "SELECT resolved_by, resolution FROM replayable.dead_letters") == [
        ("op-user", reason)
    ]


def test_a_letter_already_done_under_the_current_spec_is_closed_by_plan_once(conn, database, docs):
    """A letter of an older key whose document is done now: plan closes it, as the run."""
    old = Ledger(database, "embed", "0.9", "cfg", "old-spec", RunContext(owner="w", run_id="r0"))
    old.claim([("old-key", DOCS[0])])
    database.transaction(lambda c: old.finish(c, [Outcome("old-key", "failed", TERMINAL)]))
    for stage in ("extract", "chunk", "embed"):
        done = ledger(database, stage=stage)
        done.claim([(f"{stage}-new", DOCS[0])])
        database.transaction(
            lambda c, done=done, stage=stage: done.finish(c, [Outcome.done(f"{stage}-new")])
        )
    # The run that took the new key closed the letter already (ADR 0132); a ledger written
    # before that still holds such letters open, and plan closes them.
    assert rows(conn, "SELECT status, resolved_by FROM replayable.dead_letters") == [
        ("redriven", "rerun")
    ]
    reopen_letters(conn)
    assert plan(conn, REDRIVE) == []
    assert rows(
        conn, "SELECT status, resolved_by, resolved_run_id FROM replayable.dead_letters"
    ) == [("redriven", "ana", "rd")]
    # Planned again, the run still names that document (its report counts it done).
    assert plan(conn, REDRIVE) == []
    report = pipeline.build_report(conn, dag_id="d", run_id="rd")
    assert report["documents"] == 1 and report["stages"]["embed"]["done"] == 1
    assert json.loads(json.dumps(report))["stages"]["embed"]["dead"] == 0


# -- batch-mates of an item that kills its task ---------------------------------------------


class TaskKilled(BaseException):
    """Stands in for SIGKILL of the task process: nothing after it runs, nothing is flushed."""


class KillsOn(ItemPerDocument):
    """A stage that kills its task whenever it starts the poison document."""

    name = "extract"
    code_version = "1.0"
    item_prefix = "k"

    def __init__(self, poison):
        self.poison = poison
        self.started = []

    def process(self, items, io):
        for item in items:
            self.started.append(item.doc_id)
            if item.doc_id == self.poison:
                raise TaskKilled
            io.done(item)


def test_batch_mates_of_an_item_that_kills_its_task_end_done_not_killed(conn, dsn, docs):
    """Only the item that kills the task spends attempts on it: the others of its batch are
    taken over unstarted, started one at a time with their outcome stored at once, and end
    done; the killer alone ends dead as ``killed``."""
    from replayable.runner import Limits, run_batch

    poison = DOCS[1]
    stage = KillsOn(poison)
    # Outcomes are flushed only at the end of a batch, so a kill loses every unflushed one.
    limits = Limits(max_attempts=3, flush_after_s=3600)
    tries = 0
    for try_number in range(1, 10):
        tries = try_number
        try:
            run_batch(
                stage,
                DOCS,
                connect=lambda: db.Database(dsn),
                ctx=RunContext(
                    owner=f"try{try_number}",
                    dag_id="d",
                    run_id="r1",
                    map_index=0,
                    try_number=try_number,
                ),
                limits=limits,
            )
        except TaskKilled:
            continue
        break
    assert tries == 4  # three kills, then the killer is at its cap and the rest finish
    states = dict(
        rows(
            conn,
            "SELECT doc_id, status || ':' || coalesce(error_class, '') FROM replayable.stage_runs",
        )
    )
    assert states == {d: ("dead:killed" if d == poison else "done:") for d in DOCS}
    assert stage.started.count(poison) == 3
    attempts = dict(rows(conn, "SELECT doc_id, attempts FROM replayable.stage_runs"))
    assert attempts[poison] == 3 and all(attempts[d] <= 2 for d in DOCS if d != poison)


class Calls(KillsOn):
    """KillsOn that records the items of every ``process`` call."""

    def __init__(self, poison, together):
        super().__init__(poison)
        self.calls = []
        self.start_takeovers_together = together

    def process(self, items, io):
        self.calls.append([item.doc_id for item in items])
        super().process(items, io)


@pytest.mark.parametrize("together", [False, True])
def test_items_taken_over_are_started_one_at_a_time_unless_the_stage_packs_them(
    conn, dsn, docs, together
):
    """Embed packs its items into requests whose keys must match the killed task's, so it
    asks for its takeovers together; any other stage gets them one at a time."""
    from replayable.runner import Limits, run_batch

    stage = Calls(poison=DOCS[2], together=together)
    limits = Limits(max_attempts=3, flush_after_s=3600)

    def attempt(try_number):
        ctx = RunContext(
            owner=f"t{try_number}", dag_id="d", run_id="r", map_index=0, try_number=try_number
        )
        run_batch(stage, DOCS, connect=lambda: db.Database(dsn), ctx=ctx, limits=limits)

    with pytest.raises(TaskKilled):
        attempt(1)
    stage.poison = None  # the cause is gone: the next try finishes everything
    attempt(2)
    assert stage.calls[0] == DOCS and stage.started[:3] == DOCS[:3]
    assert stage.calls[1:] == ([DOCS] if together else [[d] for d in DOCS])
    attempts = dict(rows(conn, "SELECT doc_id, attempts FROM replayable.stage_runs"))
    assert attempts == {d: 2 for d in DOCS}
