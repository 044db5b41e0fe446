-- Set the owner and note of one open dead letter (NULL clears them).
UPDATE replayable.dead_letters
SET owner = %(owner)s, note = %(note)s
WHERE id = %(id)s AND status = 'open'
