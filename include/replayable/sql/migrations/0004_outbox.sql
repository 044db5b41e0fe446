-- The transactional outbox (ADR 0040). An event is inserted by the statement that records
-- the state it announces (finish_items: an item of a document's last stage ending done, an
-- item dead-lettered), so it is committed with that state or not at all. Publishers claim
-- due rows with FOR UPDATE SKIP LOCKED and a lease, deliver them, and mark them published
-- only once the sink has acknowledged them (ADR 0041). Every statement is idempotent.

-- An event's id is a digest of its key, so the same fact always gets the same id: the
-- outbox keeps it once, and a receiver that de-duplicates by Idempotency-Key (the id) sees
-- a redelivery as a repeat.
CREATE OR REPLACE FUNCTION replayable.outbox_event_id(event_key text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT 'evt_' || left(encode(sha256(convert_to(event_key, 'UTF8')), 'hex'), 40)
$$;

CREATE TABLE IF NOT EXISTS replayable.outbox (
    event_id        text PRIMARY KEY,           -- outbox_event_id(event_key)
    seq             bigserial NOT NULL,         -- insertion order
    event_key       text NOT NULL,              -- e.g. document.ready:<doc>:<spec hash>
    event_type      text NOT NULL,              -- document.ready | document.failed
    aggregate_type  text NOT NULL DEFAULT 'document',
    aggregate_id    text NOT NULL,              -- the doc_id
    payload         jsonb NOT NULL,
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'published', 'dead')),
    attempts        int NOT NULL DEFAULT 0,     -- deliveries started (a claim counts one)
    error_class     text,
    last_error      text,
    -- A claim leases the row: lease_owner may deliver it until lease_expires, and the row is
    -- due again (available_at) only when the lease ends. A failed delivery moves
    -- available_at to the end of its backoff.
    lease_owner     text,
    lease_expires   timestamptz,
    available_at    timestamptz NOT NULL DEFAULT now(),
    published_by    text,                       -- the publication (task) that delivered it
    created_at      timestamptz NOT NULL DEFAULT now(),
    published_at    timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The claim: due pending rows, oldest first. Published and dead rows are not in it, so the
-- claim costs the same however much history the table keeps.
CREATE INDEX IF NOT EXISTS outbox_due_idx
    ON replayable.outbox (available_at, seq) WHERE status = 'pending';
-- What one publication delivered (its asset event names it; consumers read it back).
CREATE INDEX IF NOT EXISTS outbox_publication_idx
    ON replayable.outbox (published_by, seq) WHERE published_by IS NOT NULL;
-- A document's events, for people and for the UI.
CREATE INDEX IF NOT EXISTS outbox_aggregate_idx ON replayable.outbox (aggregate_id, seq);
