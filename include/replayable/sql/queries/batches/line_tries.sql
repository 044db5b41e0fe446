-- How many earlier batches did not run each of these lines (their lines were sent again):
-- one statement for a collect's missing lines, through provider_batch_lines_resent_idx.
SELECT custom_id, count(*)::int AS n FROM replayable.provider_batch_lines
WHERE custom_id = ANY(%(custom_ids)s::text[]) AND status = 'resent'
GROUP BY custom_id
