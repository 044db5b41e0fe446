-- The stages that have linked an artifact, skipping through item_artifacts' primary key.
WITH RECURSIVE stages AS (
    (SELECT stage FROM replayable.item_artifacts ORDER BY stage LIMIT 1)
    UNION ALL
    SELECT n.stage
    FROM stages s
    CROSS JOIN LATERAL (
        SELECT a.stage FROM replayable.item_artifacts a WHERE a.stage > s.stage
        ORDER BY a.stage LIMIT 1
    ) n
)
SELECT stage FROM stages
