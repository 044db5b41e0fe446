INSERT INTO replayable.extractions
    (doc_id, extractor_version, page_count, text, text_sha256, removed_chars, engine)
VALUES %s
ON CONFLICT (doc_id, extractor_version) DO NOTHING
