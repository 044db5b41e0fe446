-- Outputs a stage stores as data, not in a table of its own (ADR 0107): a document's
-- summary today. An artifact is content-addressed: its key names the stage's version, its
-- key config and its input, never the document, so two documents with the same text share
-- one answer, paid for once. Which artifact an item produced is item_artifacts' row under
-- the item's key, written with the item's done state.
CREATE TABLE IF NOT EXISTS replayable.artifacts (
    stage           text NOT NULL,
    artifact_key    text NOT NULL,
    data            jsonb NOT NULL,
    content         bytea,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stage, artifact_key)
);

CREATE TABLE IF NOT EXISTS replayable.item_artifacts (
    stage           text NOT NULL,
    item_key        text NOT NULL,
    doc_id          text NOT NULL REFERENCES replayable.documents (doc_id),
    artifact_key    text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stage, item_key),
    FOREIGN KEY (stage, artifact_key) REFERENCES replayable.artifacts (stage, artifact_key)
);
CREATE INDEX IF NOT EXISTS item_artifacts_doc_idx ON replayable.item_artifacts (doc_id, stage);

-- A model stage asks again, under a new Idempotency-Key, for an item revived from a dead
-- letter (a refusal the provider would otherwise replay): the key counts the item's letters.
CREATE INDEX IF NOT EXISTS dead_letters_item_idx ON replayable.dead_letters (stage, item_key);
