-- Which of these artifacts a stage has stored already: paid for, by content address.
SELECT artifact_key FROM replayable.artifacts
WHERE stage = %(stage)s AND artifact_key = ANY(%(keys)s)
