-- The outputs an artifact stage reads: each document's current item done in the stage it
-- reads, under that stage's spec hash, and the artifact the item produced.
SELECT s.doc_id, i.artifact_key
FROM replayable.stage_runs s
JOIN replayable.item_artifacts i ON i.stage = s.stage AND i.item_key = s.item_key
WHERE s.stage = %(stage)s AND s.doc_id = ANY(%(doc_ids)s) AND s.is_current
  AND s.status = 'done' AND s.spec_hash = %(spec_hash)s
