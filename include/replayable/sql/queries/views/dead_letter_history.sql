-- The history of the given dead letters, oldest change first (one query per page).
SELECT letter_id, at, actor, action, status, owner, note, resolution
FROM replayable.dead_letter_history
WHERE letter_id = ANY(%(ids)s::bigint[])
ORDER BY letter_id, id
