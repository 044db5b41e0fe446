-- How each line of a collected batch ended.
UPDATE replayable.provider_batch_lines l
SET status = u.status, error_class = u.error_class, error_kind = u.error_kind, error = u.error
FROM unnest(%(custom_ids)s::text[], %(statuses)s::text[], %(error_classes)s::text[],
            %(error_kinds)s::text[], %(errors)s::text[])
    AS u (custom_id, status, error_class, error_kind, error)
WHERE l.submission = %(submission)s AND l.custom_id = u.custom_id
