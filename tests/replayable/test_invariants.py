"""replayable.invariants: a clean ledger breaks nothing; each planted break is found by name.

The ledger is built by hand with the stages' real spec hashes (:func:`clean_ledger`): A done
in every stage with its outputs, B dead in embed, C dead in chunk, each with its letter.
Each test breaks one thing and asserts that exactly its invariant names it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from replayable import db, invariants
from replayable.keys import config_hash, sha256_bytes
from replayable.stages import chunk, embed, extract
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.lineage import chunk_hash, embed_hash, extract_hash

pytestmark = pytest.mark.db

A, B, C = "a" * 64, "b" * 64, "c" * 64
MODEL = "text-embedding-3-small"
CONFIG = ChunkConfig()
OWN = {doc: sha256_bytes(f"own {doc}".encode()) for doc in (A, B)}
SHARED = sha256_bytes(b"shared")


def run_sql(conn: Any, sql: str, *params: Any) -> None:
    with conn.cursor() as cur:
        cur.execute(sql, params)
    conn.commit()


def item(conn: Any, stage: str, doc: str, status: str, spec: str, **extra: Any) -> None:
    """A current row of ``doc`` in ``stage``, keyed ``<stage>-<doc>``."""
    config = {"extract": {"engine": "pdfium"}, "embed": {"model": MODEL, "dimensions": None}}
    version = {"extract": extract.VERSION, "chunk": chunk.VERSION, "embed": embed.VERSION}
    row = {
        "stage": stage,
        "item_key": f"{stage}-{doc[0]}",
        "doc_id": doc,
        "status": status,
        "attempts": 1,
        "code_version": version.get(stage, "1.0"),
        "config_hash": config_hash(config.get(stage, {"size": 800, "overlap": 100})),
        "spec_hash": spec,
        "is_current": True,
        **extra,
    }
    names = ", ".join(row)
    marks = ", ".join(f"%({name})s" for name in row)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO replayable.stage_runs ({names}) VALUES ({marks})", row)  # noqa: S608


def letter(conn: Any, stage: str, doc: str, item_key: str, status: str = "open") -> None:
    run_sql(
        conn,
        "INSERT INTO replayable.dead_letters (stage, item_key, doc_id, error_class, error_kind,"
        " error, attempts, code_version, status) VALUES (%s, %s, %s, 'http_400', 'terminal',"
        " 'refused', 1, '1.0', %s)",
        stage,
        item_key,
        doc,
        status,
    )


@pytest.fixture
def ledger(conn: Any) -> Any:
    """A, B and C as the module docstring says, with a saved report of their run."""
    run_sql(
        conn,
        "INSERT INTO replayable.documents (doc_id, uri, size_bytes)"
        " VALUES (%s, '/a.pdf', 1), (%s, '/b.pdf', 1), (%s, '/c.pdf', 1)",
        A,
        B,
        C,
    )
    for doc in (A, B, C):
        item(conn, "extract", doc, "done", extract_hash())
        run_sql(
            conn,
            "INSERT INTO replayable.extractions (doc_id, extractor_version, page_count, text,"
            " text_sha256, engine) VALUES (%s, %s, 1, 'text', 'sha', 'pdfium')",
            doc,
            extract.extractor_id(),
        )
    item(conn, "chunk", A, "done", chunk_hash(CONFIG))
    item(conn, "chunk", B, "done", chunk_hash(CONFIG))
    item(conn, "chunk", C, "dead", chunk_hash(CONFIG), error_class="empty_text")
    letter(conn, "chunk", C, "chunk-c")
    for doc in (A, B):
        for ordinal, chunk_id in enumerate((OWN[doc], SHARED)):
            run_sql(
                conn,
                "INSERT INTO replayable.chunks (chunk_id, text) VALUES (%s, 'x')"
                " ON CONFLICT DO NOTHING",
                chunk_id,
            )
            run_sql(
                conn,
                "INSERT INTO replayable.doc_chunks VALUES (%s, %s, %s, %s, %s)",
                doc,
                extract.extractor_id(),
                CONFIG.key,
                ordinal,
                chunk_id,
            )
    for chunk_id in (OWN[A], SHARED):
        run_sql(
            conn,
            "INSERT INTO replayable.embeddings (chunk_id, model, dim, embedding)"
            " VALUES (%s, %s, 3, '[1, 2, 3]')",
            chunk_id,
            MODEL,
        )
    item(conn, "embed", A, "done", embed_hash(MODEL, None, CONFIG))
    item(conn, "embed", B, "dead", embed_hash(MODEL, None, CONFIG), error_class="http_400")
    letter(conn, "embed", B, "embed-b")
    run_sql(
        conn,
        "INSERT INTO replayable.artifacts (stage, artifact_key, data)"
        " VALUES ('summarize', 'k', '{}')",
    )
    item(conn, "summarize", A, "done", "spec-summary")
    run_sql(
        conn,
        "INSERT INTO replayable.item_artifacts (stage, item_key, doc_id, artifact_key)"
        " VALUES ('summarize', 'summarize-a', %s, 'k')",
        A,
    )
    run_sql(conn, "INSERT INTO replayable.runs (dag_id, run_id, documents) VALUES ('d', 'r', 3)")
    run_sql(
        conn,
        "INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)"
        " VALUES ('d', 'r', %s), ('d', 'r', %s), ('d', 'r', %s)",
        A,
        B,
        C,
    )
    report = {
        "documents": 3,
        "stages": {
            "extract": {"done": 3, "not_entered": 0},
            "chunk": {"done": 2, "dead": 1, "not_entered": 0},
            "embed": {"done": 1, "dead": 1, "not_entered": 1},
        },
    }
    run_sql(
        conn,
        "INSERT INTO replayable.run_reports (dag_id, run_id, report) VALUES ('d', 'r', %s)",
        json.dumps(report),
    )
    return conn


def found(conn: Any, *, quiescent: bool = False) -> list[tuple[str, str | None, str | None]]:
    return [
        (v.invariant, v.stage, v.doc_id) for v in invariants.check_ledger(conn, quiescent=quiescent)
    ]


def test_a_clean_ledger_breaks_no_invariant_even_at_quiescence(ledger):
    result = invariants.run_check(ledger, quiescent=True)
    assert result.violations == []
    assert result.clean and set(result.totals) == set(invariants.INVARIANTS)


def test_two_current_items_of_one_document_in_one_stage_are_found(ledger):
    # The unique index forbids it: dropped inside a transaction the check runs in, then undone.
    with ledger.cursor() as cur:
        cur.execute("DROP INDEX replayable.stage_runs_current_uq")
    item(ledger, "extract", A, "done", extract_hash(), item_key="extract-a2")
    try:
        assert invariants.check_ledger(ledger) == [
            invariants.Violation("one_current_item", "extract", A, "extract-a", "2 current items")
        ]
        assert ledger.status != 0  # the caller's transaction was left as it was
    finally:
        ledger.rollback()


def test_a_done_document_with_an_open_letter_of_an_older_key_has_two_outcomes(ledger):
    letter(ledger, "embed", A, "embed-a-older")
    assert found(ledger) == [("done_with_open_letter", "embed", A)]


def test_a_dead_item_whose_letter_was_closed_has_no_outcome_listed(ledger):
    run_sql(ledger, "UPDATE replayable.dead_letters SET status = 'redriven' WHERE doc_id = %s", B)
    assert found(ledger) == [("dead_without_letter", "embed", B)]


def test_two_open_letters_of_one_document_in_one_stage_are_found(ledger):
    letter(ledger, "embed", B, "embed-b-older")
    assert found(ledger) == [("one_open_letter", "embed", B)]


@pytest.mark.parametrize(
    ("statement", "stage"),
    [
        ("DELETE FROM replayable.extractions WHERE doc_id = %s", "extract"),
        ("DELETE FROM replayable.item_artifacts WHERE doc_id = %s", "summarize"),
        (
            "DELETE FROM replayable.embeddings WHERE chunk_id IN "
            "(SELECT chunk_id FROM replayable.doc_chunks WHERE doc_id = %s AND ordinal = 0)",
            "embed",
        ),
    ],
    ids=["extraction", "artifact link", "one vector"],
)
def test_a_done_item_without_its_output_is_found(ledger, statement, stage):
    run_sql(ledger, statement, A)
    assert found(ledger) == [("done_without_output", stage, A)]


def test_a_done_chunk_item_without_its_chunks_is_found_and_so_is_its_embed_item(ledger):
    run_sql(ledger, "DELETE FROM replayable.doc_chunks WHERE doc_id = %s", A)
    assert found(ledger) == [
        ("done_without_output", "chunk", A),
        ("done_without_output", "embed", A),
    ]


def test_an_embed_item_done_at_dimensions_no_vector_has_is_found(ledger):
    run_sql(
        ledger,
        "UPDATE replayable.stage_runs SET config_hash = %s, spec_hash = %s"
        " WHERE item_key = 'embed-a'",
        config_hash({"model": MODEL, "dimensions": 8}),
        embed_hash(MODEL, 8, CONFIG),
    )
    [violation] = invariants.check_ledger(ledger)
    assert (violation.invariant, violation.doc_id) == ("done_without_output", A)
    assert "no stored vector has" in violation.detail  # the vectors have 3 dimensions


def test_an_embed_item_of_an_older_lineage_needs_a_vector_under_its_model(ledger):
    run_sql(ledger, "UPDATE replayable.stage_runs SET spec_hash = 'older' WHERE stage = 'embed'")
    assert found(ledger) == []
    run_sql(ledger, "UPDATE replayable.embeddings SET model = 'another'")
    assert ("done_without_output", "embed", A) in found(ledger)


def test_a_chunk_claimed_by_a_collected_submission_is_found(ledger):
    run_sql(
        ledger,
        "INSERT INTO replayable.provider_batches (submission, provider, model, status, lines,"
        " inputs) VALUES ('s1', 'p', %s, 'collected', 1, 1), ('s2', 'p', %s, 'waiting', 1, 1)",
        MODEL,
        MODEL,
    )
    run_sql(
        ledger,
        "INSERT INTO replayable.provider_batch_chunks (model, chunk_id, submission)"
        " VALUES (%s, %s, 's1'), (%s, %s, 's2')",
        MODEL,
        OWN[B],
        "other-model",
        OWN[B],
    )
    [violation] = invariants.check_ledger(ledger)
    assert (violation.invariant, violation.item_key) == ("claim_without_submission", OWN[B])
    assert "s1" in violation.detail


def test_counters_that_disagree_with_the_current_rows_are_found(ledger):
    run_sql(
        ledger,
        "UPDATE replayable.stage_counts SET n = n + 1 WHERE stage = 'chunk' AND status = 'done'",
    )
    assert found(ledger) == [("counters_equal_ledger", "chunk", None)]


def test_a_report_counting_more_items_than_documents_is_found(ledger):
    report = {"documents": 3, "stages": {"extract": {"done": 4, "not_entered": -1}}}
    run_sql(ledger, "UPDATE replayable.run_reports SET report = %s", json.dumps(report))
    assert found(ledger) == [("report_equals_ledger", "extract", None)]


def test_at_quiescence_the_newest_report_equals_the_ledger(ledger):
    run_sql(
        ledger,
        "UPDATE replayable.stage_runs SET status = 'done', error_class = NULL"
        " WHERE item_key = 'embed-b'",
    )
    run_sql(ledger, "UPDATE replayable.dead_letters SET status = 'redriven' WHERE doc_id = %s", B)
    run_sql(
        ledger, "INSERT INTO replayable.embeddings VALUES (%s, %s, 3, '[1, 2, 3]')", OWN[B], MODEL
    )
    assert found(ledger) == []  # a report describes its run as it ended
    assert sorted(found(ledger, quiescent=True)) == [
        ("report_equals_ledger", "embed", None),  # done 1 -> 2
        ("report_equals_ledger", "embed", None),  # dead 1 -> 0
    ]


def test_items_without_an_outcome_break_quiescence_and_a_stale_lease_is_in_flight(ledger):
    run_sql(
        ledger,
        "UPDATE replayable.stage_runs SET status = 'running', lease_owner = 'w',"
        " lease_expires = now() - interval '1 minute' WHERE item_key = 'summarize-a'",
    )
    result = invariants.run_check(ledger)
    assert result.clean and result.in_flight_total == 1
    assert [(v.stage, v.doc_id) for v in result.in_flight] == [("summarize", A)]
    assert "lease expired (held by w)" in result.in_flight[0].detail
    assert found(ledger, quiescent=True) == [("no_outcome", "summarize", A)]


def test_limit_lists_fewer_rows_but_counts_them_all(ledger):
    run_sql(ledger, "UPDATE replayable.dead_letters SET status = 'redriven'")
    result = invariants.run_check(ledger, limit=1)
    assert len(result.violations) == 1
    assert result.totals["dead_without_letter"] == 2
    assert invariants.count_violations(ledger)["dead_without_letter"] == 2


def test_recorded_counts_replace_the_last_ones(ledger):
    invariants.record_counts(ledger, {"dead_without_letter": 2}, quiescent=False)
    invariants.record_counts(ledger, {"dead_without_letter": 0}, quiescent=True)
    rows = db.fetch_all(ledger, "check/recorded_counts")
    assert [(r["invariant"], r["violations"], r["quiescent"]) for r in rows] == [
        ("dead_without_letter", 0, True)
    ]
