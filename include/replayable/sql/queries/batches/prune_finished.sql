-- Forget up to `limit` submissions collected or abandoned before the retention, with their
-- lines (ON DELETE CASCADE); a submission still waiting or being sent is kept.
DELETE FROM replayable.provider_batches
WHERE submission IN (
    SELECT submission FROM replayable.provider_batches
    WHERE status IN ('collected', 'abandoned')
      AND updated_at < now() - make_interval(days => %(retention_days)s)
    ORDER BY updated_at
    LIMIT %(limit)s
)
