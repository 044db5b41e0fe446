"""bench/outbox_queries.py at a reduced size: counts and plans, never times."""

from __future__ import annotations

import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import outbox_queries  # the bench folder is put on the path just above
import synthetic_ledger

pytestmark = [pytest.mark.bench, pytest.mark.db]

DOCUMENTS = 20_000


def test_the_sweep_selection_and_the_claim_read_only_their_indexes(conn, record_property):
    synthetic_ledger.generate(conn, DOCUMENTS)
    expected = synthetic_ledger.expected(DOCUMENTS)
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM replayable.documents")
        assert cur.fetchone()[0] == DOCUMENTS
        cur.execute("SELECT count(*) FROM replayable.outbox WHERE status = 'pending'")
        pending = cur.fetchone()[0]
    conn.commit()
    assert pending == expected["ready_pending_due"] + expected["ready_pending_later"]

    sweep, claim = outbox_queries.measure(conn, repeats=5)
    minutes = int(outbox_queries.SWEEP["min_age_s"] // 60)
    sweepable = synthetic_ledger.sweepable(DOCUMENTS, minutes)
    assert sweep.rows == sum(min(n, outbox_queries.SWEEP["limit"]) for n in sweepable.values())
    assert claim.rows == outbox_queries.CLAIM["limit"]
    # The claim ran in a transaction that was rolled back: every repeat claimed the same rows.
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM replayable.outbox WHERE lease_owner IS NOT NULL")
        assert cur.fetchone()[0] == 0
    conn.commit()
    assert "Seq Scan on stage_runs" not in sweep.plan, sweep.plan
    assert "stage_runs_current" in sweep.plan, sweep.plan
    # Either partial index of pending events serves the claim (migration 0008 added the one
    # by seq); what matters is that no scan reads published or dead history.
    assert "Seq Scan on outbox" not in claim.plan, claim.plan
    assert any(
        f"Index Scan using {index}" in claim.plan
        for index in ("outbox_due_idx", "outbox_pending_seq_idx")
    ), claim.plan
    # Times are for the record only (bench/outbox_queries.py checks them at full size).
    record_property("sweep_median_ms", round(sweep.median * 1000, 2))
    record_property("claim_median_ms", round(claim.median * 1000, 2))
