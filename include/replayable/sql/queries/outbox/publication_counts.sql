-- Events one publication published, and how many of them announce a ready document.
SELECT count(*) AS events, count(*) FILTER (WHERE event_type = 'document.ready') AS ready
FROM replayable.outbox
WHERE published_by = %(publication)s
