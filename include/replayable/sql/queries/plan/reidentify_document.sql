-- A stat-named document's file fits max_bytes now and was hashed: the run processes the
-- document its bytes name instead; the stat-named one stops being current and its open
-- letters are closed, saying why, under this run's name: a redrive's `plan` that runs again
-- selects them again and lands on the same document (ADR 0083).
INSERT INTO replayable.documents (doc_id, uri, size_bytes)
VALUES (%(new_id)s, %(path)s, %(size_bytes)s)
ON CONFLICT (doc_id) DO NOTHING;

INSERT INTO replayable.file_cache AS c (path, size_bytes, mtime_ns, inode, device, doc_id)
VALUES (%(path)s, %(size_bytes)s, %(mtime_ns)s, %(inode)s, %(device)s, %(new_id)s)
ON CONFLICT (path) DO UPDATE
SET size_bytes = EXCLUDED.size_bytes, mtime_ns = EXCLUDED.mtime_ns, inode = EXCLUDED.inode,
    device = EXCLUDED.device, doc_id = EXCLUDED.doc_id, hashed_at = now();

UPDATE replayable.stage_runs SET is_current = false
WHERE doc_id = %(old_id)s AND is_current;

UPDATE replayable.dead_letters
SET status = 'redriven', resolved_at = now(), resolved_by = 'rerun',
    resolution = 'the file fits max_bytes now: it is document ' || %(new_id)s,
    resolved_dag_id = %(dag_id)s, resolved_run_id = %(run_id)s
WHERE doc_id = %(old_id)s AND status = 'open';

DELETE FROM replayable.run_docs
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s AND doc_id = %(old_id)s;

INSERT INTO replayable.run_docs (dag_id, run_id, doc_id)
VALUES (%(dag_id)s, %(run_id)s, %(new_id)s)
ON CONFLICT DO NOTHING
