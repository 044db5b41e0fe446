INSERT INTO replayable.extractions (doc_id, extractor_version, page_count, text, text_sha256)
VALUES (%(doc_id)s, %(extractor_version)s, %(page_count)s, %(text)s, %(text_sha256)s)
ON CONFLICT (doc_id, extractor_version) DO NOTHING
