-- How many dead letters an item has had: each one it came back from is a deliberate
-- revival (a redrive or a re-run of dead items), which asks the model again (ADR 0107).
SELECT count(*) AS n FROM replayable.dead_letters
WHERE stage = %(stage)s AND item_key = %(item_key)s
