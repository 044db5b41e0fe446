-- A dead letter names the task try that wrote it, so that the UI can link to that try's log
-- (ADR 0060): dag_id, run_id and map_index were already kept; the task is `batch.<stage>`.
-- Letters from before this migration get the try from their item's row where that row is
-- still the one the letter came from (the open letter of a dead item, same run and map
-- index); the others keep NULL, and their log link shows the task's latest try.
-- Idempotent: the column is added once, and only letters without a try are filled in.

ALTER TABLE replayable.dead_letters ADD COLUMN IF NOT EXISTS try_number int;

UPDATE replayable.dead_letters d
SET try_number = s.try_number
FROM replayable.stage_runs s
WHERE d.try_number IS NULL AND d.status = 'open'
  AND s.stage = d.stage AND s.item_key = d.item_key AND s.status = 'dead'
  AND s.run_id IS NOT DISTINCT FROM d.run_id AND s.map_index IS NOT DISTINCT FROM d.map_index
  AND s.try_number IS NOT NULL;
