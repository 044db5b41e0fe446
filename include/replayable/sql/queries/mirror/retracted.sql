-- Documents out of search now, and how many of those the sweep has purged, through the
-- partial index of retracted documents (the status page and the CLI read it).
SELECT count(*) AS retracted, count(purged_at) AS purged
FROM replayable.documents
WHERE retracted_at IS NOT NULL
