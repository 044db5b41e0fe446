-- The stages the ledger has items of: from the counters, a few hundred rows at most.
SELECT DISTINCT stage FROM replayable.stage_counts
