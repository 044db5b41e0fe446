-- The embed mode of the run that last took each failed item a sweep chose (ADR 0130), for
-- the sweep's re-run to use again: through stage_runs_doc_idx, for the chosen documents
-- only. An item whose run is no longer recorded (past its retention) has none.
SELECT s.stage, s.doc_id, r.embed_mode
FROM unnest(%(stages)s::text[], %(spec_hashes)s::text[]) AS st (stage, spec_hash)
JOIN replayable.stage_runs s ON s.stage = st.stage AND s.spec_hash = st.spec_hash
JOIN replayable.runs r ON r.dag_id = s.dag_id AND r.run_id = s.run_id
WHERE s.doc_id = ANY(%(doc_ids)s::text[]) AND s.is_current AND s.status = 'failed'
  AND s.dag_id = %(dag_id)s AND r.embed_mode IS NOT NULL
