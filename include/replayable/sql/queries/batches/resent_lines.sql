UPDATE replayable.provider_batch_lines SET status = 'resent'
FROM unnest(%(submissions)s::text[], %(custom_ids)s::text[]) AS u (submission, custom_id)
WHERE provider_batch_lines.submission = u.submission
  AND provider_batch_lines.custom_id = u.custom_id AND provider_batch_lines.status = 'missing'
