-- The events one publication published, in order, a keyset page at a time.
SELECT seq, event_id, event_type, aggregate_id AS doc_id, payload, published_at
FROM replayable.outbox
WHERE published_by = %(publication)s AND seq > %(after_seq)s
ORDER BY seq
LIMIT %(limit)s
