-- Open dead letters per stage, for the same documents as cli_status_stages.
SELECT stage, count(*) AS n_open
FROM replayable.dead_letters
WHERE status = 'open'
  AND (%(run_id)s::text IS NULL
       OR doc_id IN (SELECT doc_id FROM replayable.stage_runs WHERE run_id = %(run_id)s::text))
GROUP BY stage
