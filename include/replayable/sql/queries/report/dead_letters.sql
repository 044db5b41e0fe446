SELECT count(*) AS opened FROM replayable.dead_letters WHERE run_id = %(run_id)s
