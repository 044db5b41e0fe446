INSERT INTO replayable.run_reports (dag_id, run_id, report) VALUES (%(dag_id)s, %(run_id)s, %(report)s)
ON CONFLICT (dag_id, run_id) DO UPDATE SET report = EXCLUDED.report, created_at = now()
