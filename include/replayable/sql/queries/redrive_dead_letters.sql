-- Close the matching open dead letters as redriven (who, when, why) and record their
-- documents as the run's; the run revives the dead items of the redriven stage under the
-- current keys (a letter left by an older code version reopens nothing stale). Ignored
-- letters are never matched; `since` (inclusive) and `until` (exclusive) bound the letters'
-- created_at as the dead-letter page's filters do. Returns how many documents.
INSERT INTO replayable.runs (dag_id, run_id, selection)
VALUES (%(dag_id)s, %(run_id)s, %(selection)s)
ON CONFLICT (dag_id, run_id) DO UPDATE
SET source = NULL, selection = EXCLUDED.selection, to_do = NULL, batches = NULL,
    created_at = now();

DELETE FROM replayable.run_docs WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s;

WITH picked AS (
    UPDATE replayable.dead_letters
    SET status = 'redriven', resolved_at = now(), resolved_by = %(by)s,
        resolution = %(reason)s
    WHERE status = 'open'
      AND stage = %(stage)s
      AND (%(error_classes)s::text[] IS NULL OR error_class = ANY(%(error_classes)s::text[]))
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
      AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
      AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
    RETURNING doc_id
)
INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)
SELECT DISTINCT %(dag_id)s, %(run_id)s, doc_id FROM picked;

-- Fresh statistics, so that plan's joins over this run's documents are planned well.
ANALYZE replayable.run_docs;

UPDATE replayable.runs
SET documents = (SELECT count(*) FROM replayable.run_docs
                 WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s)
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
RETURNING documents
