-- Record the documents of a redrive run: those of the matching open dead letters, plus those
-- of the letters this same run has closed already (a retried `plan`, a transaction replayed
-- after a reconnect). Nothing is closed here (ADR 0083): the claim that takes an item back to
-- work closes its letters, and plan closes the letters of items already done under the
-- current spec. So a plan that runs twice selects the same documents, and a run that never
-- reaches the redriven stage (left out of `stages`, cancelled) leaves its letters open.
-- Ignored letters are never matched; `since` (inclusive) and `until` (exclusive) bound the
-- letters' created_at as the dead-letter page's filters do. Returns how many documents.
INSERT INTO replayable.runs (dag_id, run_id, selection)
VALUES (%(dag_id)s, %(run_id)s, %(selection)s)
ON CONFLICT (dag_id, run_id) DO UPDATE
SET source = NULL, selection = EXCLUDED.selection, to_do = NULL, batches = NULL,
    created_at = now();

DELETE FROM replayable.run_docs WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s;

WITH picked AS (
    SELECT doc_id
    FROM replayable.dead_letters
    WHERE status = 'open'
      AND stage = %(stage)s
      AND (%(error_classes)s::text[] IS NULL OR error_class = ANY(%(error_classes)s::text[]))
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
      AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
    UNION
    SELECT doc_id
    FROM replayable.dead_letters
    WHERE resolved_run_id = %(run_id)s AND resolved_dag_id = %(dag_id)s
      AND status = 'redriven' AND stage = %(stage)s
)
INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)
SELECT %(dag_id)s, %(run_id)s, doc_id FROM picked;

-- Fresh statistics, so that plan's joins over this run's documents are planned well.
ANALYZE replayable.run_docs;

UPDATE replayable.runs
SET documents = (SELECT count(*) FROM replayable.run_docs
                 WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s)
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
RETURNING documents
