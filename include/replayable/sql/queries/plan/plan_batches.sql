-- Number the batches of a run's documents that have work left (ADR 0010), in one round
-- trip. Along each chain of inputs (a path: extract, chunk, embed; extract, summarize; ADR
-- 0107), a document's first stage not done under its current spec_hash decides: work if the
-- run executes that stage and the item is not dead there (a revive counts dead items of its
-- stage as work); no work otherwise, and none when every stage is done. A document has work
-- when some path gives it work. The batch size is batch_size, or chosen from the documents with work
-- when it is NULL ("auto", ADR 0104), and grows so that no more than max_map_length batches
-- result. Returns each batch's number and size.
UPDATE replayable.run_docs SET batch = NULL
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s AND batch IS NOT NULL;

CREATE TEMP TABLE plan_work ON COMMIT DROP AS
WITH st AS (
    SELECT *
    FROM unnest(%(paths)s::int[], %(stages)s::text[], %(spec_hashes)s::text[],
                %(effective)s::bool[], %(revive)s::bool[])
         WITH ORDINALITY AS s (path, stage, spec_hash, effective, revive, ord)
), cells AS (
    SELECT r.doc_id, s.path, s.ord, s.effective, s.revive,
           coalesce(c.status = 'done' AND c.spec_hash = s.spec_hash, false) AS done,
           coalesce(c.status = 'dead' AND c.spec_hash = s.spec_hash, false) AS dead
    FROM replayable.run_docs r
    CROSS JOIN st s
    LEFT JOIN replayable.stage_runs c
           ON c.stage = s.stage AND c.doc_id = r.doc_id AND c.is_current
    WHERE r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s
), first_unsettled AS (
    SELECT DISTINCT ON (doc_id, path) doc_id, effective AND NOT (dead AND NOT revive) AS has_work
    FROM cells
    WHERE NOT done
    ORDER BY doc_id, path, ord
), with_work AS (
    SELECT doc_id FROM first_unsettled GROUP BY doc_id HAVING bool_or(has_work)
), numbered AS (
    SELECT doc_id, row_number() OVER (ORDER BY doc_id) - 1 AS position, count(*) OVER () AS total
    FROM with_work
)
SELECT doc_id,
       (position / greatest(
            -- batch_size, or under "auto" (NULL) auto_batches batches of auto_min to auto_max
            coalesce(%(batch_size)s::int,
                     least(greatest(ceil(total::numeric / %(auto_batches)s)::int, %(auto_min)s),
                           %(auto_max)s)),
            ceil(total::numeric / %(max_map_length)s)::int))::int AS batch
FROM numbered;

ANALYZE plan_work;

-- A reviving run closes the open letters of its first stage whose documents are done there
-- under the current spec already: no claim will take those items (ADR 0083). Under this
-- run's name, so that a redrive's selection that runs again still finds them.
UPDATE replayable.dead_letters d
SET status = 'redriven', resolved_at = now(), resolved_by = %(closed_by)s,
    resolution = 'already done under the current spec when run ' || %(run_id)s || ' planned',
    resolved_dag_id = %(dag_id)s, resolved_run_id = %(run_id)s
FROM replayable.run_docs r
JOIN replayable.stage_runs c
  ON c.stage = %(close_stage)s AND c.doc_id = r.doc_id AND c.is_current
 AND c.status = 'done' AND c.spec_hash = %(close_spec_hash)s
WHERE %(close_stage)s::text IS NOT NULL
  AND r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s
  AND d.doc_id = r.doc_id AND d.stage = %(close_stage)s AND d.status = 'open';

UPDATE replayable.run_docs r SET batch = w.batch
FROM plan_work w
WHERE r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s AND r.doc_id = w.doc_id;

UPDATE replayable.runs
SET (to_do, batches) = (
    SELECT count(*), count(DISTINCT batch) FROM replayable.run_docs
    WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s AND batch IS NOT NULL)
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s;

SELECT batch, count(*) AS size,
       sum(count(*)) OVER (ORDER BY batch) - count(*) AS first_position
FROM replayable.run_docs
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s AND batch IS NOT NULL
GROUP BY batch
ORDER BY batch
