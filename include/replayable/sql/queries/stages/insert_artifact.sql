INSERT INTO replayable.artifacts (stage, artifact_key, data)
VALUES (%(stage)s, %(key)s, %(data)s::jsonb)
ON CONFLICT (stage, artifact_key) DO NOTHING
