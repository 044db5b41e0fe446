-- Content-addressed check: a chunk embedded for any document under the model and dimensions
-- (0: the model's own size, ADR 0151) costs nothing again.
-- With_text false returns ids and sizes only (the first look over a whole batch); the size in
-- bytes is the text's stored length, read without reading the text itself.
SELECT c.chunk_id, CASE WHEN %(with_text)s THEN c.text END AS text, octet_length(c.text) AS bytes
FROM replayable.chunks c
WHERE c.chunk_id = ANY(%(chunk_ids)s)
  AND NOT EXISTS (SELECT 1 FROM replayable.embeddings e
                  WHERE e.chunk_id = c.chunk_id AND e.model = %(model)s
                    AND e.dimensions = %(dimensions)s)
ORDER BY c.chunk_id
