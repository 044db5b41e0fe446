-- Close the matching open dead letters as redriven (who, when, why) and give their items a
-- fresh attempt budget. Ignored letters are never matched.
WITH picked AS (
    UPDATE replayable.dead_letters
    SET status = 'redriven', resolved_at = now(), resolved_by = %(by)s, note = %(reason)s
    WHERE status = 'open'
      AND stage = %(stage)s
      AND (%(error_classes)s::text[] IS NULL OR error_class = ANY(%(error_classes)s::text[]))
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    RETURNING stage, item_key, doc_id
), reset AS (
    UPDATE replayable.stage_runs s
    SET status = 'pending', attempts = 0, error_class = NULL, error_kind = NULL,
        last_error = NULL, updated_at = now()
    FROM picked p
    WHERE s.stage = p.stage AND s.item_key = p.item_key AND s.status = 'dead'
    RETURNING s.doc_id
)
SELECT DISTINCT doc_id FROM picked ORDER BY doc_id
