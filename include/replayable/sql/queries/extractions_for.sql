SELECT doc_id, text_sha256, octet_length(text) AS text_bytes FROM replayable.extractions
WHERE doc_id = ANY(%(doc_ids)s) AND extractor_version = %(extractor_version)s
