"""bench/invariant_check.py at a reduced size: the consistent ledger is clean, never timed."""

from __future__ import annotations

import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import invariant_check  # the bench folder is put on the path just above

from replayable import invariants

pytestmark = [pytest.mark.bench, pytest.mark.db]

DOCUMENTS = 3_000


def test_the_consistent_ledger_breaks_no_invariant_and_its_stale_leases_are_in_flight(conn, dsn):
    invariant_check.load(dsn, DOCUMENTS)
    result = invariants.run_check(conn, limit=5)
    assert result.violations == [] and result.clean
    assert result.in_flight_total == invariant_check.in_flight(DOCUMENTS) > 0
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM replayable.stage_runs WHERE is_current")
        assert cur.fetchone()[0] > 3 * DOCUMENTS
    conn.commit()


def test_one_break_of_each_kind_on_it_is_counted(conn, dsn):
    invariant_check.load(dsn, DOCUMENTS)
    with conn.cursor() as cur:
        cur.execute(
            "DELETE FROM replayable.embeddings WHERE chunk_id = (SELECT dc.chunk_id"
            " FROM replayable.doc_chunks dc JOIN replayable.stage_runs s ON s.doc_id = dc.doc_id"
            " AND s.stage = 'embed' AND s.is_current AND s.status = 'done'"
            " WHERE dc.ordinal = 0 ORDER BY dc.doc_id LIMIT 1)"
        )
        cur.execute(
            "UPDATE replayable.dead_letters SET status = 'redriven'"
            " WHERE id = (SELECT min(id) FROM replayable.dead_letters WHERE status = 'open')"
        )
    conn.commit()
    totals = invariants.count_violations(conn)
    assert totals["done_without_output"] == 1 and totals["dead_without_letter"] == 1
    assert sum(totals.values()) == 2
