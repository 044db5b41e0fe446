"""The sweep's selection against a real Postgres: what it takes, what it leaves alone."""

from __future__ import annotations

import re

import pytest

from replayable import db, sweeper

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
    add_item(conn, 2, "embed", attempts=3)  # at the cap
    add_item(conn, 3, "embed", spec_hash="old-model")  # failed under another spec
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
    assert re.search(r"stage_runs_current_(failed|status)_idx", plan), plan


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
