-- The guard refused to retract (ADR 0138): the last complete listing stays as it was, so
-- the next run compares with it again, and the run says why.
UPDATE replayable.runs SET retract_refused = %(reason)s
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
