SELECT report FROM replayable.run_reports ORDER BY created_at DESC LIMIT 1
