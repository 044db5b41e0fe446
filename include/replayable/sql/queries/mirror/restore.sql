-- Retracted documents this run found again (any run: a glob's subset too) are restored:
-- back in search with every stage output they had, so with no model call; one whose
-- outputs the sweep purged has no current stage rows and is done again. Each gets a
-- retractions row and a document.restored event. The retracted documents are read
-- through their partial index, so this costs what they number, not the corpus.
WITH found AS (
    SELECT d.doc_id, min(f.path) AS path
    FROM replayable.documents d
    JOIN discover_found f ON f.doc_id = d.doc_id
    WHERE d.retracted_at IS NOT NULL
    GROUP BY d.doc_id
), recorded AS (
    INSERT INTO replayable.retractions (doc_id, kind, path, dag_id, run_id)
    SELECT doc_id, 'restored', path, %(dag_id)s, %(run_id)s FROM found ORDER BY doc_id
    RETURNING id, doc_id, path
), restored AS (
    UPDATE replayable.documents d SET retracted_at = NULL, purged_at = NULL
    FROM recorded r
    WHERE d.doc_id = r.doc_id
    RETURNING d.doc_id
)
INSERT INTO replayable.outbox (event_id, event_key, event_type, aggregate_id, payload)
SELECT replayable.outbox_event_id(k.event_key), k.event_key, 'document.restored', r.doc_id,
       jsonb_build_object('doc_id', r.doc_id, 'uri', r.path, 'dag_id', %(dag_id)s,
                          'run_id', %(run_id)s)
FROM recorded r
CROSS JOIN LATERAL (SELECT 'document.restored:' || r.doc_id || ':' || r.id AS event_key) k
ORDER BY r.id
ON CONFLICT (event_id) DO NOTHING
