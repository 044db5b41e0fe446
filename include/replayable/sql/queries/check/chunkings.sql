-- The (extractor, chunker) pairs the documents' chunks are filed under: few values, but no
-- index leads with them, so this is one pass over doc_chunks' primary key.
SELECT DISTINCT extractor_version, chunker_key FROM replayable.doc_chunks
