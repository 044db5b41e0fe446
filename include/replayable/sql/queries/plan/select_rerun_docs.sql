-- The documents of a partial re-run, chosen among current rows (every filter is optional:
-- NULL means any), recorded as the run's documents; returns how many. code_version_lt
-- compares versions semantically ('1.10' after '1.9') over the few versions the counters
-- know, so the rows are then found through the (stage, code_version) index.
INSERT INTO replayable.runs (dag_id, run_id, selection)
VALUES (%(dag_id)s, %(run_id)s, %(selection)s)
ON CONFLICT (dag_id, run_id) DO UPDATE
SET source = NULL, selection = EXCLUDED.selection, to_do = NULL, batches = NULL,
    created_at = now();

DELETE FROM replayable.run_docs WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s;

INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)
SELECT %(dag_id)s, %(run_id)s, s.doc_id
FROM replayable.stage_runs s
WHERE s.is_current AND s.stage = %(stage)s
  AND (%(statuses)s::text[] IS NULL OR s.status = ANY(%(statuses)s::text[]))
  AND (%(error_classes)s::text[] IS NULL OR s.error_class = ANY(%(error_classes)s::text[]))
  AND (%(code_version_lt)s::text IS NULL OR s.code_version = ANY(ARRAY(
        SELECT code_version FROM replayable.stage_counts
        WHERE stage = %(stage)s
          AND replayable.version_key(code_version)
              < replayable.version_key(%(code_version_lt)s::text)
        GROUP BY code_version HAVING sum(n) > 0)))
  AND (%(since)s::timestamptz IS NULL OR s.updated_at >= %(since)s::timestamptz)
  AND (%(doc_ids)s::text[] IS NULL OR s.doc_id = ANY(%(doc_ids)s::text[]));

-- Fresh statistics, so that plan's joins over this run's documents are planned well.
ANALYZE replayable.run_docs;

UPDATE replayable.runs
SET documents = (SELECT count(*) FROM replayable.run_docs
                 WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s)
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
RETURNING documents
