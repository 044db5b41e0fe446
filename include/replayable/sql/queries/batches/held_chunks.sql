-- Which of these chunks a submission not collected yet holds under the model and dimensions.
SELECT chunk_id FROM replayable.provider_batch_chunks
WHERE model = %(model)s AND dimensions = %(dimensions)s
  AND chunk_id = ANY(%(chunk_ids)s::text[])
