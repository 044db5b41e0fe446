SELECT doc_id, text FROM replayable.extractions
WHERE doc_id = ANY(%(doc_ids)s) AND extractor_version = %(extractor_version)s
