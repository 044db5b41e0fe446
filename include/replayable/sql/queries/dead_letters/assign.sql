-- Set the owner and note of one open dead letter (NULL clears them) as %(by)s: the history
-- trigger (migration 0003) keeps who, when and the values, in this transaction.
SELECT set_config('replayable.actor', %(by)s, true);

UPDATE replayable.dead_letters
SET owner = %(owner)s, note = %(note)s
WHERE id = %(id)s AND status = 'open'
