-- Documents a run of the sweeping pipeline left unfinished in a stage it shares with another
-- pipeline, whose run took the item over and finished it (`left_by`, claim_items.sql): done
-- under the spec a default run of this pipeline has, while one of this pipeline's later
-- stages holds no row of the document under its spec, so its later stages never ran
-- (ADR 0135). At least min_age_s since the handover, oldest first, at most `limit`; read
-- through the partial index of rows handed over, which holds only those.
SELECT st.stage, st.position, h.doc_id, h.updated_at
FROM unnest(%(stages)s::text[], %(spec_hashes)s::text[]) WITH ORDINALITY
    AS st (stage, spec_hash, position)
CROSS JOIN LATERAL (
    SELECT s.doc_id, s.updated_at
    FROM replayable.stage_runs s
    JOIN replayable.documents d ON d.doc_id = s.doc_id AND d.retracted_at IS NULL
    WHERE s.is_current AND s.left_by IS NOT NULL AND s.stage = st.stage
      AND s.status = 'done' AND s.spec_hash = st.spec_hash
      AND %(dag_id)s = ANY(s.left_by)
      AND s.updated_at <= now() - make_interval(secs => %(min_age_s)s)
      AND EXISTS (
          SELECT 1
          FROM unnest(%(stages)s::text[], %(spec_hashes)s::text[]) WITH ORDINALITY
              AS later (stage, spec_hash, position)
          WHERE later.position > st.position
            AND NOT EXISTS (SELECT 1 FROM replayable.stage_runs n
                            WHERE n.doc_id = s.doc_id AND n.stage = later.stage
                              AND n.spec_hash = later.spec_hash))
    ORDER BY s.updated_at, s.doc_id
    LIMIT %(limit)s
) h
ORDER BY h.updated_at, st.position, h.doc_id
