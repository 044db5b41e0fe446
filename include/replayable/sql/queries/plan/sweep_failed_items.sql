-- Failed items a sweep may re-run (ADR 0042, 0135): current rows, failed, not leased, last
-- changed at least min_age_s ago (so a live run's own retries are not raced) and past any
-- Retry-After their provider asked for, failed by a run of the sweeping pipeline's DAG
-- (ADR 0109). A failed item is under the cap of the run that left it (at its cap it would be
-- dead), so it is taken whatever the sweep's own max_attempts. Under the spec a default run
-- has now, or under another one when the run that left it recorded its settings: those come
-- back as `settings`, for a re-run under them (NULL for the default spec). Per stage the
-- oldest first, at most `limit`: each stage reads the partial index of current failed rows
-- in updated_at order and stops at its limit.
SELECT st.stage, st.position, f.doc_id, f.attempts, f.error_class, f.updated_at, f.settings
FROM unnest(%(stages)s::text[], %(spec_hashes)s::text[]) WITH ORDINALITY
    AS st (stage, spec_hash, position)
CROSS JOIN LATERAL (
    SELECT s.doc_id, s.attempts, s.error_class, s.updated_at,
           CASE WHEN s.spec_hash IS DISTINCT FROM st.spec_hash THEN r.settings END AS settings
    FROM replayable.stage_runs s
    LEFT JOIN replayable.runs r ON r.dag_id = s.dag_id AND r.run_id = s.run_id
    WHERE s.is_current AND s.status = 'failed' AND s.stage = st.stage
      AND s.updated_at <= now() - make_interval(secs => %(min_age_s)s)
      AND (s.retry_not_before IS NULL OR s.retry_not_before <= now())
      AND (s.spec_hash = st.spec_hash OR r.settings IS NOT NULL)
      AND s.dag_id = %(dag_id)s
      AND (s.lease_expires IS NULL OR s.lease_expires <= now())
      -- Released to wait for a provider batch (ADR 0117): its task collects it, within the
      -- batch's window; only an item its task left waiting past that is the sweep's.
      AND (s.error_class IS DISTINCT FROM 'batch_waiting'
           OR s.updated_at <= now() - interval '26 hours')
    ORDER BY s.updated_at, s.doc_id
    LIMIT %(limit)s
) f
ORDER BY f.updated_at, st.position, f.doc_id
