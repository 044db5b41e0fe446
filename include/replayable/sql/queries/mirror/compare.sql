-- Compare a whole source's listing (discover_found, in this transaction) with the last
-- complete listing of that source (ADR 0138), in one round trip. mirror_changes holds the
-- paths that are new, gone, or hold other bytes now; a file that could not be read keeps
-- the document its path held (unread is not changed). mirror_retract holds the documents
-- of gone or changed paths that nothing holds any more: no path of this listing, no path
-- of another source's listing. The unchanged paths are joined once, by path; everything
-- after that reads only the changes. Returns the counts the guard weighs. Two runs of one
-- source take turns (the lock is the transaction's), so the second compares with the
-- listing the first left, and retracts nothing twice.
SELECT pg_advisory_xact_lock(hashtextextended('replayable.mirror:' || %(source)s, 0));

CREATE TEMP TABLE mirror_changes ON COMMIT DROP AS
SELECT coalesce(o.path, f.path) AS path, o.doc_id AS old_doc,
       CASE WHEN f.path IS NULL THEN NULL
            WHEN f.unreadable AND o.doc_id IS NOT NULL THEN o.doc_id
            ELSE f.doc_id END AS new_doc
FROM (SELECT path, doc_id FROM replayable.source_files WHERE source = %(source)s) o
FULL JOIN discover_found f ON f.path = o.path
WHERE o.path IS NULL OR f.path IS NULL OR (o.doc_id <> f.doc_id AND NOT f.unreadable);

CREATE TEMP TABLE mirror_retract ON COMMIT DROP AS
SELECT c.old_doc AS doc_id,
       CASE WHEN bool_or(c.new_doc IS NOT NULL) THEN 'updated' ELSE 'deleted' END AS kind,
       min(c.path) AS path,
       min(c.new_doc) AS successor
FROM mirror_changes c
JOIN replayable.documents d ON d.doc_id = c.old_doc AND d.retracted_at IS NULL
WHERE NOT EXISTS (SELECT 1 FROM discover_found f WHERE f.doc_id = c.old_doc)
  AND NOT EXISTS (
        SELECT 1 FROM replayable.source_files s
        WHERE s.doc_id = c.old_doc
          AND (s.source <> %(source)s
               OR NOT EXISTS (SELECT 1 FROM mirror_changes m WHERE m.path = s.path)))
GROUP BY c.old_doc;

SELECT (SELECT count(DISTINCT doc_id) FROM replayable.source_files
        WHERE source = %(source)s) AS listed_before,
       (SELECT count(*) FROM discover_found) AS listed_now,
       (SELECT count(*) FROM mirror_changes) AS changed_paths,
       (SELECT count(*) FROM mirror_retract WHERE kind = 'deleted') AS deleted,
       (SELECT count(*) FROM mirror_retract WHERE kind = 'updated') AS updated
