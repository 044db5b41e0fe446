-- Batch submissions that cannot be advanced, lines a provider refused or lost, and reads
-- that stay indexed as the batch tables grow (ADR 0146, 0147, 0148).
--
-- A submission counts the passes that could not advance it (its batch, its files or its
-- results unreadable); at the cap it is abandoned with the last error's class and message,
-- and its chunk claims are freed.
ALTER TABLE replayable.provider_batches
    ADD COLUMN IF NOT EXISTS tries int NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS error_class text,
    ADD COLUMN IF NOT EXISTS error text;
ALTER TABLE replayable.provider_batches DROP CONSTRAINT IF EXISTS provider_batches_status_check;
ALTER TABLE replayable.provider_batches ADD CONSTRAINT provider_batches_status_check
    CHECK (status IN ('submitting', 'waiting', 'collected', 'abandoned'));

-- A line's new ends: refused (the provider answered its input as bad, a terminal 4xx: a
-- line of one chunk names a bad chunk, a line of several makes each of them sent alone);
-- lost (a completed batch returned no result for it: it may have been charged, so it is
-- never sent again); abandoned (its submission was).
ALTER TABLE replayable.provider_batch_lines
    DROP CONSTRAINT IF EXISTS provider_batch_lines_status_check;
ALTER TABLE replayable.provider_batch_lines ADD CONSTRAINT provider_batch_lines_status_check
    CHECK (status IN ('submitted', 'done', 'failed', 'missing', 'resent', 'refused', 'lost',
                      'abandoned'));
CREATE INDEX IF NOT EXISTS provider_batch_lines_refused_idx
    ON replayable.provider_batch_lines USING gin (chunk_ids)
    WHERE status IN ('refused', 'lost');

-- A collect counts the earlier windows of its missing lines by custom_id (resent lines
-- only), in one statement; and finished submissions are pruned after a retention.
CREATE INDEX IF NOT EXISTS provider_batch_lines_resent_idx
    ON replayable.provider_batch_lines (custom_id) WHERE status = 'resent';
CREATE INDEX IF NOT EXISTS provider_batches_finished_idx
    ON replayable.provider_batches (updated_at) WHERE status IN ('collected', 'abandoned');
