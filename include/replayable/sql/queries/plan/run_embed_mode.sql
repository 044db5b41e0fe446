-- Record the embed mode of a run whose documents were just recorded (ADR 0130).
UPDATE replayable.runs SET embed_mode = %(embed_mode)s
WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
