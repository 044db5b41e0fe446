-- The payload of a document.failed event (ADR 0040), beside its doc_id and uri: one shape
-- whichever statement opens the letter, the finish of a dead item (finish_items.sql), the
-- claim that kills an item at the attempt cap, or the claim that gives a document dead
-- again its letter back (claim_items.sql, ADR 0084, 0132). Idempotent.
CREATE OR REPLACE FUNCTION replayable.document_failed_payload(
    stage text, letter replayable.dead_letters
) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('stage', stage, 'item_key', letter.item_key,
                              'dead_letter_id', letter.id, 'error_class', letter.error_class,
                              'error_kind', letter.error_kind, 'error', left(letter.error, 2000),
                              'attempts', letter.attempts, 'code_version', letter.code_version,
                              'dag_id', letter.dag_id, 'run_id', letter.run_id)
$$;
