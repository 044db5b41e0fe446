-- Open dead letters per stage; with a run id, those of the run's documents.
SELECT dl.stage, count(*) AS n_open
FROM replayable.dead_letters dl
WHERE dl.status = 'open'
  AND (%(run_id)s::text IS NULL
       OR dl.doc_id IN (SELECT r.doc_id FROM replayable.runs ru
                        JOIN replayable.run_docs r
                          ON r.dag_id = ru.dag_id AND r.run_id = ru.run_id
                        WHERE ru.run_id = %(run_id)s::text))
GROUP BY dl.stage
