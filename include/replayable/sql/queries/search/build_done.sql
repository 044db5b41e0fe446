DELETE FROM replayable.search_index_builds WHERE name = %(name)s
