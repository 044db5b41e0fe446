-- Record how each claimed event's delivery ended (ADR 0041). Only the lease holder settles:
-- a publisher whose lease ran out and was taken over changes nothing. Outcomes:
-- 'published' (the sink acknowledged it); 'failed' (dead if terminal or at the attempt cap,
-- else due again after delay_s); 'release' (not attempted, or a systemic stop: due again
-- now, and the attempt it took is given back). Returns the rows settled.
WITH input AS (
    SELECT * FROM unnest(%(event_ids)s::text[], %(outcomes)s::text[], %(error_classes)s::text[],
                         %(error_kinds)s::text[], %(errors)s::text[], %(delays_s)s::float8[])
        AS t (event_id, outcome, error_class, error_kind, error, delay_s)
)
UPDATE replayable.outbox o
SET status = CASE WHEN i.outcome = 'published' THEN 'published'
                  WHEN i.outcome = 'release' THEN 'pending'
                  WHEN i.error_kind = 'terminal' OR o.attempts >= %(max_attempts)s THEN 'dead'
                  ELSE 'pending' END,
    attempts = CASE WHEN i.outcome = 'release' THEN greatest(o.attempts - 1, 0)
                    ELSE o.attempts END,
    error_class = coalesce(i.error_class, o.error_class),
    last_error = coalesce(i.error, o.last_error),
    published_at = CASE WHEN i.outcome = 'published' THEN now() END,
    published_by = CASE WHEN i.outcome = 'published' THEN %(publication)s END,
    available_at = CASE WHEN i.outcome = 'failed'
                        THEN now() + make_interval(secs => i.delay_s)
                        ELSE now() END,
    lease_owner = NULL, lease_expires = NULL, updated_at = now()
FROM input i
WHERE o.event_id = i.event_id AND o.status = 'pending' AND o.lease_owner = %(owner)s
RETURNING o.event_id, o.event_type, o.status
