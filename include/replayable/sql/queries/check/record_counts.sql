-- Keep the last check's counts, one row per invariant (the metrics endpoint reads them).
INSERT INTO replayable.invariant_checks AS c (invariant, violations, quiescent, checked_at)
SELECT invariant, violations, %(quiescent)s, now()
FROM unnest(%(invariants)s::text[], %(violations)s::bigint[]) AS t (invariant, violations)
ON CONFLICT (invariant) DO UPDATE
SET violations = EXCLUDED.violations, quiescent = EXCLUDED.quiescent,
    checked_at = EXCLUDED.checked_at
