-- How many earlier batches did not run this line (their lines were sent again).
SELECT count(*)::int AS n FROM replayable.provider_batch_lines
WHERE custom_id = %(custom_id)s AND status = 'resent'
