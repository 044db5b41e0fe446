-- The open dead letters a redrive would take, per stage, and when the database counted
-- them (`as_of`, which pins the end of a filtered redrive to what was seen). The filters
-- match as in list_dead_letters (a NULL filter means any); `ids` narrows them to the
-- letters a person ticked, which come back listed per stage. Letters that are no longer
-- open are never taken: the redrive itself only closes open ones. `dag_id` is the pipeline
-- whose run made the newest of them: its DAG redrives the stage's letters (ADR 0108).
SELECT stage, count(*) AS letters, count(DISTINCT doc_id) AS documents,
       (SELECT n.dag_id FROM replayable.dead_letters n WHERE n.id = max(d.id)) AS dag_id,
       array_agg(id ORDER BY id) FILTER (WHERE %(ids)s::bigint[] IS NOT NULL) AS ids,
       now() AS as_of
FROM replayable.dead_letters d
WHERE status = 'open'
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
  AND (%(stage)s::text IS NULL OR stage = %(stage)s::text)
  AND (%(error_classes)s::text[] IS NULL OR error_class = ANY(%(error_classes)s::text[]))
  AND (%(since)s::timestamptz IS NULL OR created_at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s::timestamptz)
GROUP BY stage
ORDER BY stage
