-- What a search covers (ADR 0152): of the documents not retracted that reached the embed
-- stage, those it searches (an embed item done for the model and dimensions, and chunks
-- under the chunker and extractor searched, as best_chunks.sql scopes them), and the others
-- by why they are left out, from their current embed item: done only under other settings,
-- failed, dead, or not finished yet. One pass over the embed stage's current rows, each
-- document probed once through its own indexes; about 5 s at a million documents, so a
-- search reads it from search_coverage, counted again when stale (search/coverage_of.sql).
SELECT count(*) FILTER (WHERE searched) AS documents,
       count(*) FILTER (WHERE NOT searched AND status = 'done') AS other_settings,
       count(*) FILTER (WHERE NOT searched AND status = 'failed') AS failed,
       count(*) FILTER (WHERE NOT searched AND status = 'dead') AS dead,
       count(*) FILTER (WHERE NOT searched AND status IN ('pending', 'running')) AS unfinished
FROM (
    SELECT cur.status, embedded.found AND chunked.found AS searched
    FROM replayable.stage_runs cur
    JOIN replayable.documents d ON d.doc_id = cur.doc_id AND d.retracted_at IS NULL
    CROSS JOIN LATERAL (
        SELECT EXISTS (SELECT 1 FROM replayable.stage_runs s
                       WHERE s.doc_id = cur.doc_id AND s.stage = 'embed'
                         AND s.status = 'done' AND s.config_hash = %(config_hash)s) AS found
    ) embedded
    CROSS JOIN LATERAL (
        SELECT EXISTS (SELECT 1 FROM replayable.doc_chunks dc
                       WHERE dc.doc_id = cur.doc_id
                         AND dc.extractor_version = %(extractor_version)s
                         AND dc.chunker_key = %(chunker_key)s) AS found
    ) chunked
    WHERE cur.stage = 'embed' AND cur.is_current
    OFFSET 0
) docs
