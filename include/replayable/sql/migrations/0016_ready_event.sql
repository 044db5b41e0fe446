-- The payload of a document.ready event (ADR 0040), beside its doc_id and uri: one shape
-- whichever statement announces the document, the finish of its last stage's item
-- (finish_items.sql) or the claim that records that item done from outputs already stored
-- (claim_items.sql, ADR 0125).
CREATE OR REPLACE FUNCTION replayable.document_ready_payload(
    stage text, item_key text, spec_hash text, versions jsonb, dag_id text, run_id text
) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('stage', stage, 'item_key', item_key, 'spec_hash', spec_hash,
                              'versions', versions, 'dag_id', dag_id, 'run_id', run_id)
$$;
