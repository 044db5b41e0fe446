-- A stage of this run could not be built (ADR 0133): keep why, by stage, for the report.
-- Every batch task of the stage writes the same message; a later one replaces it.
UPDATE replayable.runs
SET stage_errors = coalesce(stage_errors, '{}'::jsonb)
                   || jsonb_build_object(%(stage)s::text, %(message)s::text)
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
