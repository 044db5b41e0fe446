-- A run's documents by their current state in each stage, counted by status and class.
SELECT c.stage, c.status, coalesce(c.error_class, '') AS error_class, count(*) AS n
FROM replayable.run_docs r
CROSS JOIN unnest(%(stages)s::text[]) AS st (stage)
JOIN replayable.stage_runs c ON c.stage = st.stage AND c.doc_id = r.doc_id AND c.is_current
WHERE r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s
GROUP BY 1, 2, 3
ORDER BY 1, 2, 3
