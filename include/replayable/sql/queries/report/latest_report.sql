SELECT report FROM replayable.run_reports
WHERE created_at >= %(since)s AND (%(dag_id)s::text IS NULL OR dag_id = %(dag_id)s)
ORDER BY created_at DESC LIMIT 1
