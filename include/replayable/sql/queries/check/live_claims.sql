-- A chunk claim (provider_batch_chunks) is held by a live submission only: a collected (or
-- abandoned) one has released its chunks. Through provider_batch_chunks_submission_idx from
-- the few submissions that are not live.
SELECT 'embed' AS stage, NULL::text AS doc_id, c.chunk_id AS item_key,
       'chunk claimed for ' || c.model
           || coalesce(' at ' || nullif(c.dimensions, 0)::text || ' dimensions', '')
           || ' by submission ' || c.submission || ', which is ' || b.status AS detail,
       count(*) OVER () AS total
FROM replayable.provider_batches b
JOIN replayable.provider_batch_chunks c ON c.submission = b.submission
WHERE b.status <> ALL(%(live)s::text[])
ORDER BY c.submission, c.model, c.dimensions, c.chunk_id
LIMIT %(limit)s
