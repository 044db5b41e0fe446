-- Files of this scan that must be read: new, or with a stat that differs from the cache.
SELECT s.path
FROM discover_scan s
LEFT JOIN replayable.file_cache c USING (path)
WHERE c.path IS NULL
   OR (c.size_bytes, c.mtime_ns, c.inode, c.device)
      IS DISTINCT FROM (s.size_bytes, s.mtime_ns, s.inode, s.device)
