-- Whether the last build of a search index failed less than %(pause_s)s seconds ago: the
-- searches until then read every vector instead of building it again (ADR 0137).
SELECT EXISTS (
    SELECT 1 FROM replayable.search_index_builds
    WHERE name = %(name)s AND failed_at > now() - make_interval(secs => %(pause_s)s)
) AS paused
