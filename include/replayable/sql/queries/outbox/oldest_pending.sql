-- The oldest pending event: the backlog's age. The partial index of pending rows by seq
-- finds it without reading published or dead history.
SELECT seq, created_at, extract(epoch FROM now() - created_at)::float8 AS age_s
FROM replayable.outbox
WHERE status = 'pending'
ORDER BY seq
LIMIT 1
