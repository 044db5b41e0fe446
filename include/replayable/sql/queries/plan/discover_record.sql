-- Record a discover scan (temp tables discover_scan and discover_hashed) as the run's
-- documents, in one round trip:
-- 1. cache the hashes just computed;
-- 2. the scan's files with a cache entry matching their stat, and their document ids;
-- 3. new documents;
-- 4. a document once named after its stat (too large to read) gives way to the document its
--    bytes name; a document whose recorded path is gone takes the path it was found at, and
--    an extract dead letter of class missing_file that it left is reopened;
-- 5. the run and its documents (a re-run of this task replaces them); old runs expire.
INSERT INTO replayable.file_cache AS c (path, size_bytes, mtime_ns, inode, device, doc_id)
SELECT path, size_bytes, mtime_ns, inode, device, doc_id FROM discover_hashed WHERE NOT stat_id
ON CONFLICT (path) DO UPDATE
SET size_bytes = EXCLUDED.size_bytes, mtime_ns = EXCLUDED.mtime_ns, inode = EXCLUDED.inode,
    device = EXCLUDED.device, doc_id = EXCLUDED.doc_id, hashed_at = now();

CREATE TEMP TABLE discover_found ON COMMIT DROP AS
SELECT s.path, s.size_bytes, c.doc_id, false AS stat_id, false AS unreadable
FROM discover_scan s
JOIN replayable.file_cache c USING (path)
WHERE (c.size_bytes, c.mtime_ns, c.inode, c.device)
      = (s.size_bytes, s.mtime_ns, s.inode, s.device)
UNION ALL
SELECT path, size_bytes, doc_id, true, unreadable FROM discover_hashed WHERE stat_id;

INSERT INTO replayable.documents (doc_id, uri, size_bytes, stat_id)
SELECT DISTINCT ON (doc_id) doc_id, path, size_bytes, stat_id
FROM discover_found ORDER BY doc_id, path
ON CONFLICT (doc_id) DO NOTHING;

-- A file once too large to read, now hashed: its stat-named document gives way.
WITH superseded AS (
    SELECT DISTINCT d.doc_id AS old_id, f.doc_id AS new_id
    FROM replayable.documents d
    JOIN discover_found f ON f.path = d.uri
    WHERE d.stat_id AND NOT f.stat_id AND f.doc_id <> d.doc_id
), demoted AS (
    UPDATE replayable.stage_runs s SET is_current = false
    FROM superseded
    WHERE s.doc_id = superseded.old_id AND s.is_current
    RETURNING s.doc_id
)
UPDATE replayable.dead_letters dl
SET status = 'redriven', resolved_at = now(), resolved_by = 'discover',
    resolution = 'the file fits max_bytes now: it is document ' || s.new_id
FROM superseded s
WHERE dl.doc_id = s.old_id AND dl.status = 'open';

WITH moved AS (
    UPDATE replayable.documents d SET uri = f.path
    FROM (SELECT DISTINCT ON (doc_id) doc_id, path FROM discover_found ORDER BY doc_id, path) f
    WHERE d.doc_id = f.doc_id AND d.uri <> f.path
      AND NOT EXISTS (SELECT 1 FROM discover_scan s WHERE s.path = d.uri)
    RETURNING d.doc_id, d.uri
), reopened AS (
    UPDATE replayable.stage_runs s
    SET status = 'pending', attempts = 0, error_class = NULL, error_kind = NULL,
        last_error = NULL, updated_at = now()
    FROM moved m
    WHERE s.stage = 'extract' AND s.doc_id = m.doc_id AND s.is_current
      AND s.status = 'dead' AND s.error_class = 'missing_file'
    RETURNING s.stage, s.item_key, m.uri
)
UPDATE replayable.dead_letters d
SET status = 'redriven', resolved_at = now(), resolved_by = 'discover',
    resolution = 'the file was found again at ' || r.uri
FROM reopened r
WHERE d.stage = r.stage AND d.item_key = r.item_key AND d.status = 'open';

DELETE FROM replayable.runs WHERE created_at < now() - make_interval(days => %(retention_days)s);

INSERT INTO replayable.runs (dag_id, run_id, source)
VALUES (%(dag_id)s, %(run_id)s, %(source)s)
ON CONFLICT (dag_id, run_id) DO UPDATE
SET source = EXCLUDED.source, selection = NULL, to_do = NULL, batches = NULL, created_at = now();

DELETE FROM replayable.run_docs WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s;

INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)
SELECT DISTINCT %(dag_id)s, %(run_id)s, doc_id FROM discover_found;

-- Fresh statistics, so that plan's joins over this run's documents are planned well.
ANALYZE replayable.run_docs;

UPDATE replayable.runs
SET documents = (SELECT count(*) FROM replayable.run_docs
                 WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s)
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
RETURNING documents
