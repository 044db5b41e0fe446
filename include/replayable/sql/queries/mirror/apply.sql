-- A whole source's listing passed the guard (ADR 0138): it becomes the source's last
-- complete listing, and the documents compare.sql found unheld are retracted, each with a
-- retractions row and a document.deleted or document.updated event in the outbox, in the
-- transaction that records the run's documents: all of it commits, or none. Only the
-- changed paths are written.
DELETE FROM replayable.source_files s
USING mirror_changes c
WHERE s.source = %(source)s AND s.path = c.path AND c.new_doc IS NULL;

INSERT INTO replayable.source_files (source, path, doc_id)
SELECT %(source)s, path, new_doc FROM mirror_changes WHERE new_doc IS NOT NULL
ON CONFLICT (source, path) DO UPDATE SET doc_id = EXCLUDED.doc_id, listed_at = now();

WITH recorded AS (
    INSERT INTO replayable.retractions (doc_id, kind, source, path, successor, dag_id, run_id)
    SELECT doc_id, kind, %(source)s, path, CASE WHEN kind = 'updated' THEN successor END,
           %(dag_id)s, %(run_id)s
    FROM mirror_retract
    ORDER BY doc_id
    RETURNING id, doc_id, kind, path, successor
), retracted AS (
    UPDATE replayable.documents d SET retracted_at = now()
    FROM recorded r
    WHERE d.doc_id = r.doc_id
    RETURNING d.doc_id
)
INSERT INTO replayable.outbox (event_id, event_key, event_type, aggregate_id, payload)
SELECT replayable.outbox_event_id(k.event_key), k.event_key, 'document.' || r.kind, r.doc_id,
       jsonb_build_object('doc_id', r.doc_id, 'uri', r.path, 'source', %(source)s,
                          'successor', r.successor, 'dag_id', %(dag_id)s,
                          'run_id', %(run_id)s)
FROM recorded r
CROSS JOIN LATERAL (SELECT 'document.' || r.kind || ':' || r.doc_id || ':' || r.id AS event_key) k
ORDER BY r.id
ON CONFLICT (event_id) DO NOTHING;

-- A retracted document's open dead letters leave the work list: nobody has to fix a file that
-- is gone. Ignored, not redriven, with the reason (its items stay dead; the history keeps
-- the change). Found through the document's current dead items, so by index.
UPDATE replayable.dead_letters dl
SET status = 'ignored', resolved_at = now(), resolved_by = 'discover',
    resolution = 'its file left ' || %(source)s || ' (document.' || r.kind || ', run '
                 || %(run_id)s || '): retracted from the index'
FROM mirror_retract r
JOIN replayable.stage_runs s ON s.doc_id = r.doc_id AND s.is_current AND s.status = 'dead'
WHERE dl.stage = s.stage AND dl.item_key = s.item_key AND dl.status = 'open';

UPDATE replayable.runs SET retract_refused = NULL
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
