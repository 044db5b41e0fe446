-- The run's extracted texts, by size: octet_length reads a stored text's length without
-- decompressing it; only a text whose bytes pass max_text_chars (characters never outnumber
-- bytes) has its characters counted, so that chunk can refuse it unread (ADR 0087).
SELECT doc_id, text_sha256, octet_length(text) AS text_bytes,
       CASE WHEN octet_length(text) > %(max_text_chars)s THEN char_length(text) END AS text_chars
FROM replayable.extractions
WHERE doc_id = ANY(%(doc_ids)s) AND extractor_version = %(extractor_version)s
