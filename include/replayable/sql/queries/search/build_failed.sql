-- Record that the build of a search index failed (ADR 0137).
INSERT INTO replayable.search_index_builds (name, error) VALUES (%(name)s, %(error)s)
ON CONFLICT (name) DO UPDATE
SET failed_at = now(), failures = search_index_builds.failures + 1, error = EXCLUDED.error
