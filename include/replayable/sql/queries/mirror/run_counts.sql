-- What a run did to the index (ADR 0138): documents retracted as deleted, superseded as
-- updated, restored, and why it refused to retract, if it did.
SELECT count(*) FILTER (WHERE r.kind = 'deleted') AS retracted,
       count(*) FILTER (WHERE r.kind = 'updated') AS superseded,
       count(*) FILTER (WHERE r.kind = 'restored') AS restored,
       (SELECT retract_refused FROM replayable.runs
        WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s) AS refused
FROM replayable.retractions r
WHERE r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s
