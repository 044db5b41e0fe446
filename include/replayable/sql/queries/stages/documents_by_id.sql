SELECT doc_id, uri, size_bytes FROM replayable.documents WHERE doc_id = ANY(%(doc_ids)s)
