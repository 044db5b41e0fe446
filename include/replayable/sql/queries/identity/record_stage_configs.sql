-- Every config a stage's version was planned with (ADR 0140).
INSERT INTO replayable.stage_configs (stage, version, config_hash, config)
SELECT * FROM unnest(
    %(stages)s::text[], %(versions)s::text[], %(config_hashes)s::text[], %(configs)s::jsonb[]
)
ON CONFLICT DO NOTHING
