-- Record each stage's class (ADR 0140); a name the ledger holds keeps the class it was
-- first recorded with.
INSERT INTO replayable.stage_identities (stage, class_path, dag_id)
SELECT stage, class_path, %(dag_id)s
FROM unnest(%(stages)s::text[], %(class_paths)s::text[]) AS m(stage, class_path)
ON CONFLICT (stage) DO NOTHING
