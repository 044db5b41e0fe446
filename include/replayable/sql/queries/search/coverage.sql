-- What a search covers (ADR 0152): of the documents not retracted that reached the embed
-- stage, those it searches (an embed item done for the model and dimensions, and chunks
-- under the chunker and extractor searched, as best_chunks.sql scopes them), and the others
-- by why they are left out, from their current embed item: done only under other settings,
-- failed, dead, or not finished yet. Set-based: the documents searched are found once each
-- way and hash-joined to the current items, not probed one by one (a probe per document took
-- 12-17 s at a million, this 3 s); a search reads the count from search_coverage while it
-- is fresh.
WITH embedded AS (
    SELECT DISTINCT s.doc_id FROM replayable.stage_runs s
    WHERE s.stage = 'embed' AND s.status = 'done' AND s.config_hash = %(config_hash)s
), chunked AS (
    SELECT DISTINCT dc.doc_id FROM replayable.doc_chunks dc
    WHERE dc.extractor_version = %(extractor_version)s AND dc.chunker_key = %(chunker_key)s
), searched AS (
    SELECT doc_id FROM embedded JOIN chunked USING (doc_id)
)
SELECT count(*) FILTER (WHERE s.doc_id IS NOT NULL) AS documents,
       count(*) FILTER (WHERE s.doc_id IS NULL AND cur.status = 'done') AS other_settings,
       count(*) FILTER (WHERE s.doc_id IS NULL AND cur.status = 'failed') AS failed,
       count(*) FILTER (WHERE s.doc_id IS NULL AND cur.status = 'dead') AS dead,
       count(*) FILTER (WHERE s.doc_id IS NULL
                          AND cur.status IN ('pending', 'running')) AS unfinished
FROM replayable.stage_runs cur
JOIN replayable.documents d ON d.doc_id = cur.doc_id AND d.retracted_at IS NULL
LEFT JOIN searched s ON s.doc_id = cur.doc_id
WHERE cur.stage = 'embed' AND cur.is_current
