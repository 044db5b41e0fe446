-- Resolve one open dead letter as ignored, recording who, when and why; the owner's note
-- stays, and the history trigger (migration 0003) keeps the change. The item stays dead in
-- stage_runs: an ignored letter is how a dead item stays accounted for.
SELECT set_config('replayable.actor', %(by)s, true);

UPDATE replayable.dead_letters
SET status = 'ignored', resolved_at = now(), resolved_by = %(by)s, resolution = %(reason)s
WHERE id = %(id)s AND status = 'open'
