SELECT dc.doc_id, dc.ordinal, dc.chunk_id
FROM replayable.doc_chunks dc
WHERE dc.doc_id = ANY(%(doc_ids)s)
  AND dc.extractor_version = %(extractor_version)s AND dc.chunker_key = %(chunker_key)s
ORDER BY dc.doc_id, dc.ordinal
