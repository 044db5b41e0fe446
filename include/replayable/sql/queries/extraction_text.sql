SELECT text FROM replayable.extractions
WHERE doc_id = %(doc_id)s AND extractor_version = %(extractor_version)s
