-- Resolve one open dead letter as ignored, recording who, when and why. The item stays
-- dead in stage_runs: an ignored letter is how a dead item stays accounted for.
UPDATE replayable.dead_letters
SET status = 'ignored', resolved_at = now(), resolved_by = %(by)s, note = %(note)s
WHERE id = %(id)s AND status = 'open'
