SELECT chunk_id, text FROM replayable.chunks WHERE chunk_id = ANY(%(chunk_ids)s::text[])
