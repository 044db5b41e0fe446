-- A pass could not advance this submission: count the try, and at the cap abandon it with
-- the error and free its chunk claims (ADR 0147). Returns its new status and the chunks
-- freed (none before the cap).
WITH tried AS (
    UPDATE replayable.provider_batches
    SET tries = tries + 1, error_class = %(error_class)s, error = %(error)s,
        status = CASE WHEN tries + 1 >= %(max_tries)s THEN 'abandoned' ELSE status END,
        updated_at = now()
    WHERE submission = %(submission)s AND status IN ('submitting', 'waiting')
    RETURNING submission, status, tries, batch_id, input_file_id
), freed AS (
    DELETE FROM replayable.provider_batch_chunks c
    USING tried t
    WHERE c.submission = t.submission AND t.status = 'abandoned'
    RETURNING c.chunk_id
), lines AS (
    UPDATE replayable.provider_batch_lines l SET status = 'abandoned'
    FROM tried t
    WHERE l.submission = t.submission AND t.status = 'abandoned' AND l.status = 'submitted'
)
SELECT t.status, t.tries, t.batch_id, t.input_file_id,
       coalesce((SELECT array_agg(chunk_id ORDER BY chunk_id) FROM freed), '{}') AS chunk_ids
FROM tried t
