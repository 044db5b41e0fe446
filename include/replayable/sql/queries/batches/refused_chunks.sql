-- Which of these chunks a line the provider refused as bad, or lost, held under this model
-- and dimensions; for each, the line that decides it: a lost one first, then the one with
-- fewest chunks (ADR 0146).
SELECT DISTINCT ON (c.chunk_id)
       c.chunk_id, l.status, l.custom_id, l.error_class, l.error,
       cardinality(l.chunk_ids) AS size
FROM replayable.provider_batch_lines l
JOIN replayable.provider_batches b ON b.submission = l.submission
CROSS JOIN LATERAL unnest(l.chunk_ids) AS c (chunk_id)
WHERE l.status IN ('refused', 'lost') AND l.chunk_ids && %(chunk_ids)s::text[]
  AND b.model = %(model)s AND b.dimensions = %(dimensions)s
  AND c.chunk_id = ANY(%(chunk_ids)s::text[])
ORDER BY c.chunk_id, (l.status = 'lost') DESC, cardinality(l.chunk_ids)
