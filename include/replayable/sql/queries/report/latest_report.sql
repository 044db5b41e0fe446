SELECT report FROM replayable.run_reports
WHERE created_at >= %(since)s
ORDER BY created_at DESC LIMIT 1
