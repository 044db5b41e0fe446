-- Record each stage's version with its code and config (ADR 0140); a version the ledger
-- holds already keeps the code it was first recorded with.
WITH mine AS (
    SELECT * FROM unnest(
        %(stages)s::text[], %(versions)s::text[], %(code_hashes)s::text[],
        %(configs)s::jsonb[], %(config_hashes)s::text[]
    ) AS m(stage, version, code_hash, config, config_hash)
), versions AS (
    INSERT INTO replayable.stage_versions (stage, version, code_hash, config, dag_id)
    SELECT stage, version, code_hash, config, %(dag_id)s FROM mine
    ON CONFLICT (stage, version) DO NOTHING
)
SELECT v.stage, v.version, v.code_hash, v.dag_id
FROM replayable.stage_versions v
JOIN mine m USING (stage, version)
ORDER BY v.stage
