"""replayable.invariants: a clean ledger breaks nothing; each planted break is found by name.

The ledger is built by hand with the stages' real hashes (``invariant_ledger``): A done
in every stage with its outputs, B dead in embed, C dead in chunk, each with its letter.
Each test breaks one thing and asserts that exactly its invariant names it.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg2.extensions
import pytest

import corpus
from checks import subset
from invariant_ledger import CONFIG, MODEL, OWN, A, B, fill_clean_ledger, item, letter, run_sql
from replayable import invariants
from replayable.keys import config_hash
from replayable.stages.lineage import embed_hash, extract_hash

pytestmark = pytest.mark.db


@pytest.fixture
def ledger(conn: Any) -> Any:
    """A, B and C as the module docstring says, with a saved report of their run."""
    return fill_clean_ledger(conn)


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
        # The caller's transaction is left as it was.
        assert ledger.status == psycopg2.extensions.STATUS_IN_TRANSACTION
    finally:
        ledger.rollback()


def test_a_done_document_with_an_open_letter_of_an_older_key_has_two_outcomes(ledger):
    letter(ledger, "embed", A, "embed-a-older")
    assert found(ledger) == [("done_with_open_letter", "embed", A)]


def test_a_dead_item_whose_letter_was_redriven_has_no_outcome_listed(ledger):
    run_sql(ledger, "UPDATE replayable.dead_letters SET status = 'ignored' WHERE doc_id = %s", B)
    assert found(ledger) == []  # ignored on purpose: the item stays accounted for
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


def done_at_dimensions(ledger, dimensions: int):
    """Re-key A's done embed item as asked at ``dimensions``; return the one violation found."""
    run_sql(
        ledger,
        "UPDATE replayable.stage_runs SET config_hash = %s, spec_hash = %s"
        " WHERE item_key = 'embed-a'",
        config_hash({"model": MODEL, "dimensions": dimensions}),
        embed_hash(MODEL, dimensions, CONFIG),
    )
    [violation] = invariants.check_ledger(ledger)
    return violation


def test_an_embed_item_done_at_dimensions_no_vector_has_is_found(ledger):
    violation = done_at_dimensions(ledger, 8)
    assert (violation.invariant, violation.doc_id) == ("done_without_output", A)
    assert "no stored vector has" in violation.detail  # the vectors have 3 dimensions


def test_an_embed_item_done_at_explicit_dimensions_is_not_served_by_own_size_vectors(ledger):
    """A's vectors were asked at the model's own size (3 long); an item done at an explicit
    ``dimensions`` of 3 is another purchase (ADR 0151), and those vectors are not its own."""
    violation = done_at_dimensions(ledger, 3)
    assert (violation.invariant, violation.doc_id) == ("done_without_output", A)


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
        "UPDATE replayable.run_reports"
        " SET report = jsonb_set(report, '{stages,embed,done}', '2')",  # the ledger holds 1
    )
    assert found(ledger) == []  # a run may still be changing what its report counts
    assert found(ledger, quiescent=True) == [("report_equals_ledger", "embed", None)]
    # An item of the run's documents changed after the report: it describes an older ledger.
    run_sql(ledger, "UPDATE replayable.stage_runs SET updated_at = now() + interval '1 minute'")
    assert found(ledger, quiescent=True) == []


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
    rows = invariants.recorded_counts(ledger)
    assert [(r["invariant"], r["violations"], r["quiescent"]) for r in rows] == [
        ("dead_without_letter", 0, True)
    ]


def test_a_pipeline_run_with_a_dead_document_leaves_a_clean_ledger(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 4)
    corpus.write_pdf(folder / "poisoned.pdf", ["This text makes the provider answer POISON-400."])
    model.set_faults(fail_inputs_containing={"POISON-400": 400})
    report = run_in_process(
        {
            "source": str(folder),
            "batch_size": 2,
            "stages": ["extract", "chunk", "embed", "summarize"],
        }
    )
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["embed"]["dead"] == 1
    result = invariants.run_check(conn, quiescent=True)
    assert result.violations == [] and result.clean
    # The check reads what the run wrote: removing one vector is seen.
    run_sql(
        conn,
        "DELETE FROM replayable.embeddings WHERE chunk_id IN"
        " (SELECT chunk_id FROM replayable.embeddings LIMIT 1)",
    )
    assert invariants.count_violations(conn)["done_without_output"] >= 1
