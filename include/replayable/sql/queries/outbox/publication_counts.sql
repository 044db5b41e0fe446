-- Events one publication published: in all, those that announce a ready document, and
-- those that announce a document leaving the index (deleted or updated, ADR 0138).
SELECT count(*) AS events, count(*) FILTER (WHERE event_type = 'document.ready') AS ready,
       count(*) FILTER (WHERE event_type IN ('document.deleted', 'document.updated'))
           AS retracted
FROM replayable.outbox
WHERE published_by = %(publication)s
