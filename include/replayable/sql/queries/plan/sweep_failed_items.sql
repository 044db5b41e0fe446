-- Failed items a sweep may re-run (ADR 0042): current rows, failed, under the attempt cap,
-- not leased, last changed at least min_age_s ago (so a live run's own retries are not
-- raced), failed by a run of the sweeping pipeline's DAG (ADR 0109), and under the spec a
-- default run has now (the re-run would redo the others under other keys). Per stage the oldest first, at most `limit`: each stage reads
-- the partial index of current failed rows in updated_at order and stops at its limit.
SELECT st.stage, st.position, f.doc_id, f.attempts, f.error_class, f.updated_at
FROM unnest(%(stages)s::text[], %(spec_hashes)s::text[]) WITH ORDINALITY
    AS st (stage, spec_hash, position)
CROSS JOIN LATERAL (
    SELECT s.doc_id, s.attempts, s.error_class, s.updated_at
    FROM replayable.stage_runs s
    WHERE s.is_current AND s.status = 'failed' AND s.stage = st.stage
      AND s.updated_at <= now() - make_interval(secs => %(min_age_s)s)
      AND s.spec_hash = st.spec_hash
      AND s.dag_id = %(dag_id)s
      AND s.attempts < %(max_attempts)s
      AND (s.lease_expires IS NULL OR s.lease_expires <= now())
      -- Released to wait for a provider batch (ADR 0117): its task collects it, within the
      -- batch's window; only an item its task left waiting past that is the sweep's.
      AND (s.error_class IS DISTINCT FROM 'batch_waiting'
           OR s.updated_at <= now() - interval '26 hours')
    ORDER BY s.updated_at, s.doc_id
    LIMIT %(limit)s
) f
ORDER BY f.updated_at, st.position, f.doc_id
