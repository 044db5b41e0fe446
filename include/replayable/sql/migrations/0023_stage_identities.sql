-- A name is an identity (ADR 0140): the class each stage name stands for, and the code each
-- of its versions stands for. A plan records its pipeline's stages here and is refused when
-- a name already means another class, or a version other code.
CREATE TABLE IF NOT EXISTS replayable.stage_identities (
    stage       text PRIMARY KEY,
    class_path  text NOT NULL,
    dag_id      text NOT NULL,  -- the pipeline that recorded it first
    recorded_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS replayable.stage_versions (
    stage       text NOT NULL REFERENCES replayable.stage_identities (stage),
    version     text NOT NULL,
    -- A hash of the stage class's code (comments and docstrings aside); NULL for a stage
    -- Replayable ships, whose version its release keeps.
    code_hash   text,
    config      jsonb NOT NULL,  -- the key config a plan first recorded it with
    dag_id      text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stage, version)
);

-- Every config a stage's version was planned with: what its keys were made of.
CREATE TABLE IF NOT EXISTS replayable.stage_configs (
    stage       text NOT NULL,
    version     text NOT NULL,
    config_hash text NOT NULL,
    config      jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stage, version, config_hash),
    FOREIGN KEY (stage, version) REFERENCES replayable.stage_versions (stage, version)
);
