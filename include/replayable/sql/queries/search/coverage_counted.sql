-- The last count of what a search of these settings covers (ADR 0152), and whether it is
-- fresh: younger than %(fresh_s)s seconds and than the newest run report (a run that ends
-- may have changed what is done or retracted).
SELECT documents, left_out, counted_at,
       counted_at > now() - make_interval(secs => %(fresh_s)s)
       AND counted_at >= coalesce((SELECT max(created_at) FROM replayable.run_reports),
                                  '-infinity') AS fresh
FROM replayable.search_coverage
WHERE config_hash = %(config_hash)s AND extractor_version = %(extractor_version)s
  AND chunker_key = %(chunker_key)s
