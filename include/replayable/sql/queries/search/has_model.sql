SELECT EXISTS (SELECT 1 FROM replayable.embeddings WHERE model = %(model)s) AS found
