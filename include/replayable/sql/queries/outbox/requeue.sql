-- Send dead outbox events again (ADR 0072): pending, due now, their attempts from zero. Only
-- dead rows change; the error they died with stays until a delivery records another. Either
-- list may be NULL (no filter); the caller asks for at least one filter or for all.
UPDATE replayable.outbox
SET status = 'pending', attempts = 0, available_at = now(),
    lease_owner = NULL, lease_expires = NULL, updated_at = now()
WHERE status = 'dead'
  AND (%(event_ids)s::text[] IS NULL OR event_id = ANY(%(event_ids)s::text[]))
  AND (%(error_classes)s::text[] IS NULL OR error_class = ANY(%(error_classes)s::text[]))
RETURNING event_id, seq
