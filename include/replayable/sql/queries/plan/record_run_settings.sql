-- The params a run was planned with, less its selection, for the sweep (ADR 0135).
UPDATE replayable.runs SET settings = %(settings)s::jsonb
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
