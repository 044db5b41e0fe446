-- New items enter as pending; an item seen before keeps its state and attempt count.
INSERT INTO replayable.stage_runs
    (stage, item_key, doc_id, code_version, config_hash, dag_id, run_id, map_index)
VALUES %s
ON CONFLICT (stage, item_key) DO NOTHING
