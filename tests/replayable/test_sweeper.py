"""The sweep's selection against a real Postgres: what it takes, what it leaves alone."""

from __future__ import annotations

import json
import re

import pytest

from replayable import db, pipeline, sweeper
from replayable.ledger import Ledger, Outcome, RunContext
from replayable.retry import Classified, ErrorKind

pytestmark = pytest.mark.db

HASHES = {"extract": "sx", "chunk": "sc", "embed": "se", "summarize": "ss"}
PIPELINE = "document_pipeline"


def doc(n: int) -> str:
    return f"{n:064x}"


def add_item(
    conn,
    n: int,
    stage: str,
    *,
    status: str = "failed",
    age_s: float = 3600,
    attempts: int = 1,
    spec_hash: str | None = None,
    lease_s: float | None = None,
    current: bool = True,
    dag_id: str = PIPELINE,
    error_class: str | None = None,
) -> None:
    """One stage_runs row of document ``n``, last changed ``age_s`` ago."""
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES (%s, %s, 1)"
            " ON CONFLICT DO NOTHING",
            (doc(n), f"/d/{n}.pdf"),
        )
        cur.execute(
            "INSERT INTO replayable.stage_runs (stage, item_key, doc_id, status, attempts,"
            " code_version, config_hash, spec_hash, is_current, lease_owner, lease_expires,"
            " updated_at, dag_id, error_class)"
            " VALUES (%s, %s, %s, %s, %s, '1.0', 'c', %s, %s,"
            " CASE WHEN %s::float8 IS NULL THEN NULL ELSE 'w' END,"
            " now() + make_interval(secs => %s::float8),"
            " now() - make_interval(secs => %s::float8), %s, %s)",
            (
                stage,
                f"{stage}-{n}-{spec_hash or HASHES[stage]}",
                doc(n),
                status,
                attempts,
                spec_hash or HASHES[stage],
                current,
                lease_s,
                lease_s,
                age_s,
                dag_id,
                error_class,
            ),
        )
    conn.commit()


def select(conn, **overrides):
    options = {
        "dag_id": PIPELINE,
        "stages": list(HASHES),
        "spec_hashes": HASHES,
        "min_age_s": 600,
        "max_items": 100,
        "max_attempts": 3,
    }
    return sweeper.select_failed(conn, **{**options, **overrides})


def test_failed_items_old_enough_are_grouped_by_stage_in_pipeline_order(conn):
    add_item(conn, 1, "embed")
    add_item(conn, 2, "extract")
    add_item(conn, 3, "embed", age_s=7200)
    found = select(conn)
    assert list(found.by_stage) == ["extract", "embed"]
    assert found.by_stage == {"extract": [doc(2)], "embed": sorted([doc(1), doc(3)])}
    assert found.items == 3


def test_what_a_sweep_must_leave_alone_is_left_alone(conn):
    add_item(conn, 1, "embed", age_s=60)  # too young: a live run may still retry it
    add_item(conn, 3, "embed", spec_hash="old-model")  # another spec, no settings recorded
    add_item(conn, 4, "embed", status="dead")
    add_item(conn, 5, "embed", status="done")
    add_item(conn, 6, "embed", current=False)  # history, not the document's current row
    add_item(conn, 7, "embed", lease_s=300)  # leased right now
    add_item(conn, 8, "embed", lease_s=-300)  # a lease that has ended does not count
    assert select(conn).by_stage == {"embed": [doc(8)]}


def test_an_item_waiting_for_a_provider_batch_is_its_tasks_until_the_window_ends(conn):
    """Released to wait for a batch (ADR 0117), an item is failed with class batch_waiting
    while its task is deferred; the sweep leaves it to that task for the batch's window."""
    add_item(conn, 1, "embed", error_class="batch_waiting", age_s=3600)
    add_item(conn, 2, "embed", error_class="batch_waiting", age_s=27 * 3600)
    add_item(conn, 3, "embed", error_class="http_503", age_s=3600)
    assert select(conn).by_stage == {"embed": sorted([doc(2), doc(3)])}


def test_a_sweep_takes_only_what_its_own_pipelines_runs_left(conn):
    """Pipelines share the ledger, and a stage of the same name and spec in two of them
    shares its items: each pipeline's sweep re-runs, in its own DAG, what its runs left."""
    add_item(conn, 1, "extract")
    add_item(conn, 2, "extract", dag_id="keyword_pipeline")
    assert select(conn).by_stage == {"extract": [doc(1)]}
    assert select(conn, dag_id="keyword_pipeline").by_stage == {"extract": [doc(2)]}


def test_a_document_failed_in_two_stages_is_rerun_from_the_earlier_one(conn):
    add_item(conn, 1, "chunk")
    add_item(conn, 1, "embed")
    assert select(conn).by_stage == {"chunk": [doc(1)]}


def test_never_more_than_max_items_oldest_first(conn):
    for n in range(1, 8):
        add_item(conn, n, "extract" if n % 2 else "embed", age_s=1000 * n)
    found = select(conn, max_items=3)
    assert found.items == 3
    assert found.by_stage == {"extract": [doc(5), doc(7)], "embed": [doc(6)]}


def test_nothing_to_sweep_asks_for_no_rerun(conn):
    found = select(conn)
    assert found.items == 0
    assert sweeper.rerun_requests(found, sweep_run_id="r", max_attempts=3) == []


def test_each_stage_gets_one_rerun_conf_with_a_run_id_of_its_own(conn):
    add_item(conn, 1, "extract")
    add_item(conn, 2, "embed")
    requests = sweeper.rerun_requests(select(conn), sweep_run_id="scheduled__x", max_attempts=5)
    assert requests == [
        {
            "trigger_run_id": "sweep__extract__scheduled__x",
            "conf": {
                "rerun": {"stage": "extract", "status": ["failed"], "doc_ids": [doc(1)]},
                "max_attempts": 5,
            },
        },
        {
            "trigger_run_id": "sweep__embed__scheduled__x",
            "conf": {
                "rerun": {"stage": "embed", "status": ["failed"], "doc_ids": [doc(2)]},
                "max_attempts": 5,
            },
        },
    ]


def test_the_selection_reads_current_rows_through_an_index(conn):
    """Which of the current-row indexes a tiny table gets depends on its statistics; that it
    never scans stage_runs is what holds at any size (tests/bench checks it at 20,000
    documents, bench/outbox_queries.py at a million)."""
    add_item(conn, 1, "embed")
    with conn.cursor() as cur:
        cur.execute("SET enable_seqscan = off")  # a tiny table would be scanned otherwise
        cur.execute(
            "EXPLAIN " + db.sql("plan/sweep_failed_items"),
            {
                "dag_id": PIPELINE,
                "stages": list(HASHES),
                "spec_hashes": list(HASHES.values()),
                "min_age_s": 600.0,
                "max_attempts": 3,
                "limit": 10,
            },
        )
        plan = "\n".join(row[0] for row in cur.fetchall())
    conn.rollback()
    assert "Seq Scan on stage_runs" not in plan, plan
    # Any of the partial indexes of current rows (failed, status, version), whichever the
    # tiny table's statistics favour: a column added to stage_runs moved it to version's.
    assert re.search(r"stage_runs_current_(failed|status|version)_idx", plan), plan


# -- what the sweep used to leave failed forever, or take too early (ADR 0135) --------------


def rows(conn, sql, *params):
    with conn.cursor() as cur:
        cur.execute(sql, params)
        found = cur.fetchall() if cur.description else []
    conn.commit()
    return found


def run_row(conn, run_id, settings=None):
    """The runs row a plan writes, and the settings it records for the run."""
    rows(
        conn,
        "INSERT INTO replayable.runs (dag_id, run_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
        PIPELINE,
        run_id,
    )
    if settings is not None:
        pipeline.record_run_settings(conn, dag_id=PIPELINE, run_id=run_id, params=settings)
        conn.commit()


def failed_by(conn, n, stage, run_id, spec_hash, **extra):
    add_item(conn, n, stage, spec_hash=spec_hash, **extra)
    rows(
        conn,
        "UPDATE replayable.stage_runs SET run_id = %s WHERE doc_id = %s AND stage = %s",
        run_id,
        doc(n),
        stage,
    )


def test_an_item_failed_at_or_past_the_sweeps_cap_is_swept_not_stuck(conn):
    """A run with max_attempts 5 left it failed at 3 (its cap is 5): the sweep takes it."""
    add_item(conn, 1, "embed", attempts=3)
    add_item(conn, 2, "embed", attempts=4)
    assert select(conn, max_attempts=3).by_stage == {"embed": [doc(1), doc(2)]}


def test_an_item_is_not_swept_before_the_wait_its_provider_asked_for(conn, dsn):
    database = db.Database(dsn)
    try:
        for n in (1, 2):
            add_item(conn, n, "embed", status="running", lease_s=60, age_s=0)
            rows(
                conn,
                "UPDATE replayable.stage_runs SET lease_owner = 'w' WHERE doc_id = %s",
                doc(n),
            )
        ledger = Ledger(database, "embed", "1.0", "c", "se", RunContext(owner="w"))
        busy = Classified("http_429", ErrorKind.RETRYABLE, "slow down", retry_after_s=3600)
        quick = Classified("http_503", ErrorKind.RETRYABLE, "try again")
        database.transaction(
            lambda c: ledger.finish(
                c,
                [
                    Outcome(f"embed-{1}-se", "failed", busy),
                    Outcome(f"embed-{2}-se", "failed", quick),
                ],
            )
        )
    finally:
        database.close()
    # 40 minutes later both are past min_age (30), but the 429 asked for an hour.
    elapse(conn, "40 minutes")
    assert select(conn, min_age_s=1800).by_stage == {"embed": [doc(2)]}
    elapse(conn, "21 minutes")
    assert select(conn, min_age_s=1800).by_stage == {"embed": [doc(1), doc(2)]}


def elapse(conn, interval):
    """Move every item's times back by ``interval``, as if that much time had passed."""
    rows(
        conn,
        "UPDATE replayable.stage_runs SET updated_at = updated_at - %s::interval,"
        " retry_not_before = retry_not_before - %s::interval",
        interval,
        interval,
    )


def test_an_item_failed_under_a_runs_own_settings_is_swept_with_those_settings(conn):
    run_row(conn, "r-default")
    run_row(conn, "r-small", {"chunk_size": 400, "chunk_overlap": 50, "rerun": None})
    run_row(conn, "r-gone")  # a run that recorded no settings (older than this change)
    failed_by(conn, 1, "embed", "r-default", HASHES["embed"])
    failed_by(conn, 2, "chunk", "r-small", "small-chunks")
    failed_by(conn, 3, "chunk", "r-gone", "other-spec")
    found = select(conn)
    assert found.by_stage == {"embed": [doc(1)]}
    assert found.items == 2
    (other,) = found.other
    assert (other.stage, other.doc_ids) == ("chunk", [doc(2)])
    assert other.settings == {"chunk_size": 400, "chunk_overlap": 50}
    requests = sweeper.rerun_requests(found, sweep_run_id="s1", max_attempts=3)
    assert [r["conf"] for r in requests] == [
        {"rerun": {"stage": "embed", "status": ["failed"], "doc_ids": [doc(1)]}, "max_attempts": 3},
        {
            "chunk_size": 400,
            "chunk_overlap": 50,
            "rerun": {"stage": "chunk", "status": ["failed"], "doc_ids": [doc(2)]},
            "max_attempts": 3,
        },
    ]
    # One run per stage and settings, each with a run id of its own that a retried sweep
    # derives again.
    ids = [r["trigger_run_id"] for r in requests]
    assert len(set(ids)) == 2 and ids[0] == "sweep__embed__s1"
    again = sweeper.rerun_requests(select(conn), sweep_run_id="s1", max_attempts=3)
    assert [r["trigger_run_id"] for r in again] == ids


def test_a_runs_higher_attempt_cap_goes_with_its_sweep(conn):
    run_row(conn, "r-patient", {"chunk_size": 400, "max_attempts": 6})
    failed_by(conn, 1, "chunk", "r-patient", "small-chunks", attempts=4)
    (request,) = sweeper.rerun_requests(select(conn), sweep_run_id="s", max_attempts=3)
    assert request["conf"]["max_attempts"] == 6


def test_plan_records_the_settings_a_sweep_needs_and_not_the_selection(conn):
    run_row(conn, "r1")
    params = {"chunk_size": 400, "source": "/data", "stages": None, "rerun": None, "redrive": None}
    pipeline.record_run_settings(conn, dag_id=PIPELINE, run_id="r1", params=params)
    conn.commit()
    (stored,) = rows(conn, "SELECT settings FROM replayable.runs WHERE run_id = 'r1'")[0]
    assert stored == {"chunk_size": 400}
    assert json.dumps(stored)


def test_a_sweep_rerun_under_a_runs_settings_finishes_its_item_under_them(
    run_in_process, conn, tmp_path
):
    """The whole loop: plan records the settings, the sweep's conf is one a run accepts, and
    the item ends done under the key it failed under, not the default's."""
    from checks import subset

    conf = {"source": str(subset(tmp_path, 1)), "stages": ["extract", "chunk"]}
    first = run_in_process({**conf, "chunk_size": 400, "chunk_overlap": 40})
    assert first["stages"]["chunk"]["done"] == 1, first["_tasks"]
    (key,) = rows(conn, "SELECT item_key FROM replayable.stage_runs WHERE stage = 'chunk'")[0]
    # Its task's retries ran out on a provider outage, say: failed, under its cap.
    rows(
        conn,
        "UPDATE replayable.stage_runs SET status = 'failed', error_class = 'http_503',"
        " updated_at = now() - interval '2 hours' WHERE stage = 'chunk'",
    )
    (request,) = sweeper.rerun_requests(select(conn), sweep_run_id="s", max_attempts=3)
    assert request["conf"]["chunk_size"] == 400 and "source" not in request["conf"]
    again = run_in_process(request["conf"])
    assert not again["_failed"], again["_tasks"]
    assert again["stages"]["chunk"]["done"] == 1
    assert rows(
        conn, "SELECT item_key, status FROM replayable.stage_runs WHERE stage = 'chunk'"
    ) == [(key, "done")]


def ran_under(conn, n: int, stage: str, run_id: str, embed_mode: str) -> None:
    """Document ``n``'s item in ``stage`` was last taken by run ``run_id`` in ``embed_mode``."""
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO replayable.runs (dag_id, run_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (PIPELINE, run_id),
        )
        cur.execute(
            "UPDATE replayable.runs SET embed_mode = %s WHERE dag_id = %s AND run_id = %s",
            (embed_mode, PIPELINE, run_id),
        )
        cur.execute(
            "UPDATE replayable.stage_runs SET run_id = %s WHERE stage = %s AND doc_id = %s",
            (run_id, stage, doc(n)),
        )
    conn.commit()


def test_an_item_a_batch_mode_run_left_is_rerun_in_batch_mode(conn):
    """A re-run whose conf dropped ``embed_mode`` would buy a batch's chunks in sync mode, at
    the sync price: the sweep keeps the mode each item's run used (ADR 0130)."""
    add_item(conn, 1, "embed")
    add_item(conn, 2, "embed")
    add_item(conn, 3, "embed")
    add_item(conn, 4, "chunk")
    ran_under(conn, 1, "embed", "batched", "batch")
    ran_under(conn, 2, "embed", "synced", "sync")
    ran_under(conn, 4, "chunk", "batched", "batch")
    requests = sweeper.rerun_requests(select(conn), sweep_run_id="scheduled__x", max_attempts=3)
    assert requests == [
        {
            "trigger_run_id": "sweep__chunk__batch__scheduled__x",
            "conf": {
                "rerun": {"stage": "chunk", "status": ["failed"], "doc_ids": [doc(4)]},
                "max_attempts": 3,
                "embed_mode": "batch",
            },
        },
        {
            "trigger_run_id": "sweep__embed__scheduled__x",
            "conf": {
                "rerun": {"stage": "embed", "status": ["failed"], "doc_ids": [doc(2), doc(3)]},
                "max_attempts": 3,
            },
        },
        {
            "trigger_run_id": "sweep__embed__batch__scheduled__x",
            "conf": {
                "rerun": {"stage": "embed", "status": ["failed"], "doc_ids": [doc(1)]},
                "max_attempts": 3,
                "embed_mode": "batch",
            },
        },
    ]


def hand_over(database, n: int, *, left_by: str, taken_by: str) -> None:
    """Document ``n``'s shared extract item: failed by a run of ``left_by``, then claimed and
    finished by a run of ``taken_by`` (a pipeline that shares the stage and its spec)."""
    key = f"extract-{n}-sx"
    for dag_id, outcome in ((left_by, "failed"), (taken_by, "done")):
        ledger = Ledger(
            database, "extract", "1.0", "c", "sx", RunContext(f"w-{dag_id}", dag_id, f"r-{dag_id}")
        )
        ledger.claim([(key, doc(n))])
        error = Classified("http_503", ErrorKind.RETRYABLE, "try again")
        result = Outcome(key, outcome, error if outcome == "failed" else None)
        database.transaction(lambda c, ledger=ledger, result=result: ledger.finish(c, [result]))


def test_a_document_another_pipeline_finished_a_shared_stage_of_is_swept_into_the_rest(conn, dsn):
    """Finding 13: this pipeline's run left extract failed, another pipeline that shares the
    stage finished it, and nothing was left failed for this pipeline's sweep, while its later
    stages never ran for the document. The sweep re-runs it from the stage handed over."""
    rows(
        conn,
        "INSERT INTO replayable.documents (doc_id, uri, size_bytes) VALUES (%s, '/d/1.pdf', 1),"
        " (%s, '/d/2.pdf', 1)",
        doc(1),
        doc(2),
    )
    database = db.Database(dsn)
    try:
        hand_over(database, 1, left_by=PIPELINE, taken_by="keyword_pipeline")
        hand_over(database, 2, left_by="keyword_pipeline", taken_by=PIPELINE)
    finally:
        database.close()
    elapse(conn, "2 hours")
    found = select(conn)
    assert found.by_stage == {}
    assert found.unrun == {"extract": [doc(1)]}
    assert select(conn, dag_id="keyword_pipeline").unrun == {"extract": [doc(2)]}
    assert sweeper.rerun_requests(found, sweep_run_id="s1", max_attempts=3) == [
        {
            "trigger_run_id": "sweep__extract__unrun__s1",
            "conf": {
                "rerun": {"stage": "extract", "status": ["done"], "doc_ids": [doc(1)]},
                "max_attempts": 3,
            },
        }
    ]
    # Once this pipeline's later stages hold rows for it, there is nothing left to finish.
    for stage in ("chunk", "embed", "summarize"):
        add_item(conn, 1, stage, status="done", age_s=0)
    assert select(conn).unrun == {}


def test_the_sweeps_rerun_of_a_handed_over_document_runs_its_later_stages(
    run_in_process, conn, tmp_path
):
    """The whole loop for finding 13: the sweep's conf is one a run accepts, and it runs the
    stages the handover left unrun, buying nothing for the stage already done."""
    from checks import subset

    first = run_in_process({"source": str(subset(tmp_path, 1)), "stages": ["extract"]})
    assert first["stages"]["extract"]["done"] == 1, first["_tasks"]
    # As a handover leaves it: another pipeline's run finished the item this one's left.
    rows(
        conn,
        "UPDATE replayable.stage_runs SET dag_id = 'keyword_pipeline', left_by = %s,"
        " updated_at = now() - interval '2 hours' WHERE stage = 'extract'",
        [PIPELINE],
    )
    ((spec,),) = rows(conn, "SELECT spec_hash FROM replayable.stage_runs WHERE stage = 'extract'")
    found = select(
        conn, stages=["extract", "chunk", "embed"], spec_hashes={**HASHES, "extract": spec}
    )
    (request,) = sweeper.rerun_requests(found, sweep_run_id="s", max_attempts=3)
    again = run_in_process(request["conf"])
    assert not again["_failed"], again["_tasks"]
    assert again["stages"]["chunk"]["done"] == 1 and again["stages"]["embed"]["done"] == 1
    assert rows(
        conn, "SELECT status, attempts FROM replayable.stage_runs WHERE stage = 'extract'"
    ) == [("done", 1)]
