-- Documents whose id starts with a prefix; two rows are enough to call it ambiguous.
SELECT doc_id FROM replayable.documents
WHERE starts_with(doc_id, %(prefix)s)
ORDER BY doc_id
LIMIT 2
