-- Held until the embedding is committed, so two workers never pay for one chunk.
SELECT pg_try_advisory_xact_lock(hashtextextended(%(chunk_id)s || '/' || %(model)s, 0)) AS locked
