-- Outbox events of one status (pending: the backlog; dead), oldest first, for the CLI: the
-- partial index of that status by seq (migration 0008) reads only the rows shown.
SELECT seq, event_id, event_type, aggregate_id AS doc_id, status, attempts, error_class,
       last_error, available_at, created_at, updated_at
FROM replayable.outbox
WHERE status = %(status)s
ORDER BY seq
LIMIT %(limit)s
