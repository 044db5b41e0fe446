-- Lease up to `limit` due events to one publisher (ADR 0041). Due means pending with
-- available_at passed; the partial index on (available_at, seq) of pending rows finds them
-- without reading published history. SKIP LOCKED passes over rows another publisher is
-- claiming right now, and the claim moves available_at to the lease's end, so a leased row
-- is not due for anyone else until its lease is over. Each claim counts one attempt.
-- due_by (the time of a publisher's first claim; NULL: now) keeps a publisher from taking
-- back, in the same call, what it failed or handed back itself.
WITH due AS (
    SELECT event_id
    FROM replayable.outbox
    WHERE status = 'pending' AND available_at <= coalesce(%(due_by)s::timestamptz, now())
    ORDER BY available_at, seq
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE replayable.outbox o
SET attempts = o.attempts + 1,
    lease_owner = %(owner)s,
    lease_expires = now() + make_interval(secs => %(lease_s)s),
    available_at = now() + make_interval(secs => %(lease_s)s),
    updated_at = now()
FROM due
WHERE o.event_id = due.event_id
RETURNING o.event_id, o.seq, o.event_type, o.aggregate_type, o.aggregate_id, o.payload,
          o.attempts, o.created_at, now() AS claimed_at
