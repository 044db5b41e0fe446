INSERT INTO replayable.item_artifacts (stage, item_key, doc_id, artifact_key)
VALUES %s
ON CONFLICT (stage, item_key) DO NOTHING
