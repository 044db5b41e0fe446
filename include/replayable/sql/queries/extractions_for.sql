SELECT doc_id, text_sha256 FROM replayable.extractions
WHERE doc_id = ANY(%(doc_ids)s) AND extractor_version = %(extractor_version)s
