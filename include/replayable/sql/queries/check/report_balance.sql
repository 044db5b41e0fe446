-- Nothing lost (invariant 4), in every saved report: no stage counts more items than the run
-- has documents (not_entered, the rest, is never negative), and the report's documents are
-- its run's. run_reports holds one row per run.
SELECT st.key AS stage, NULL::text AS doc_id, NULL::text AS item_key,
       'run ' || r.run_id || ' of ' || r.dag_id || ': the report counts '
           || ((r.report->>'documents')::bigint - (st.value->>'not_entered')::bigint)::text
           || ' items of ' || (r.report->>'documents') || ' documents'
           || coalesce(', the run ' || run.documents::text, '') AS detail,
       count(*) OVER () AS total
FROM replayable.run_reports r
CROSS JOIN LATERAL jsonb_each(coalesce(r.report->'stages', '{}'::jsonb)) AS st
LEFT JOIN replayable.runs run ON run.dag_id = r.dag_id AND run.run_id = r.run_id
WHERE (st.value->>'not_entered')::bigint < 0
   OR (run.documents IS NOT NULL AND run.documents <> (r.report->>'documents')::bigint)
ORDER BY r.created_at, r.run_id, st.key
LIMIT %(limit)s
