-- The settings a search reads by default (ADR 0152): those of the pipeline's most recent
-- complete run, one over its whole source (no rerun or redrive selection) that ran the
-- embed stage and wrote its report; or, when a run is named, that run's.
SELECT r.run_id, r.settings
FROM replayable.run_reports rr
JOIN replayable.runs r ON r.dag_id = rr.dag_id AND r.run_id = rr.run_id
WHERE rr.dag_id = %(dag_id)s
  AND r.settings IS NOT NULL
  AND rr.report -> 'stages' ? 'embed'
  AND CASE WHEN %(run_id)s::text IS NULL THEN r.selection IS NULL
           ELSE r.run_id = %(run_id)s::text END
ORDER BY rr.created_at DESC, rr.run_id DESC
LIMIT 1
