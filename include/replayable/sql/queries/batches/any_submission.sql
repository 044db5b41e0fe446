SELECT 1 FROM replayable.provider_batches LIMIT 1
