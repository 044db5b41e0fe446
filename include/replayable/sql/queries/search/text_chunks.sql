-- The chunks that share the most words with a question (Postgres full-text search, ADR
-- 0143), among the chunks of current documents (not retracted, ADR 0138), as best_chunks.sql
-- scopes them. The question's words are OR'ed (plainto_tsquery ANDs them, which a question
-- in a sentence rarely matches whole) and ranked by how often they occur, divided by 1 + the log of the
-- chunk's length (ts_rank's normalisation 1: recall@5 0.768 on the Debian PDFs' headings,
-- against 0.505 by cover density, ts_rank_cd; ADR 0143). The expression is the one the GIN
-- index chunks_text_search is built on, so the match reads it when it exists.
WITH q AS (
    SELECT replace(plainto_tsquery(%(config)s::regconfig, %(query)s)::text, ' & ', ' | ')
           ::tsquery AS q
)
SELECT dc.doc_id, d.uri, dc.ordinal, c.chunk_id,
       ts_rank(to_tsvector(%(config)s::regconfig, c.text), q.q, 1) AS score,
       left(c.text, %(snippet)s) AS snippet
FROM q
JOIN replayable.chunks c ON to_tsvector(%(config)s::regconfig, c.text) @@ q.q
JOIN replayable.doc_chunks dc
  ON dc.chunk_id = c.chunk_id AND dc.extractor_version = %(extractor_version)s
 AND dc.chunker_key = %(chunker_key)s
JOIN replayable.documents d ON d.doc_id = dc.doc_id AND d.retracted_at IS NULL
WHERE (%(source)s::text IS NULL OR starts_with(d.uri, %(source)s::text))
  AND EXISTS (SELECT 1 FROM replayable.stage_runs s
              WHERE s.doc_id = dc.doc_id AND s.stage = 'embed' AND s.status = 'done'
                AND s.config_hash = %(config_hash)s)
ORDER BY score DESC, dc.doc_id, dc.ordinal
LIMIT %(k)s
