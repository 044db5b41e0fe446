-- The search index of a model and dimension, by name: whether it exists and is valid (a
-- concurrent build that failed leaves an invalid index, which the planner never uses).
SELECT i.indisvalid AS valid
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'replayable'
JOIN pg_index i ON i.indexrelid = c.oid
WHERE c.relname = %(name)s
