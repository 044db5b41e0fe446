-- Every change to a dead letter is kept: who, when, and what it became (ADR 0015).
--
-- A trigger writes one row to dead_letter_history per change of a letter's status, owner,
-- note or resolution, in the transaction that made it, whoever made it: the UI, a redrive or
-- a re-run, or someone in psql. The actor is the transaction's `replayable.actor` setting
-- (the UI sets it to the Airflow user), else the letter's resolved_by (the pipeline's
-- resolutions name their run or user), else the database role. The history is append-only.
-- A resolution's reason goes to `resolution`, so that it no longer overwrites the owner's note.

ALTER TABLE replayable.dead_letters ADD COLUMN IF NOT EXISTS resolution text;

CREATE TABLE IF NOT EXISTS replayable.dead_letter_history (
    id              bigserial PRIMARY KEY,
    letter_id       bigint NOT NULL REFERENCES replayable.dead_letters (id),
    at              timestamptz NOT NULL DEFAULT now(),
    actor           text NOT NULL,
    action          text NOT NULL,          -- assigned, noted, ignored, redriven, open, recorded
    status          text NOT NULL,
    owner           text,
    note            text,
    resolution      text
);
CREATE INDEX IF NOT EXISTS dead_letter_history_letter_idx
    ON replayable.dead_letter_history (letter_id, id);

-- What letters already held before there was a history: one "recorded" row each, so that the
-- first change after this migration does not lose an earlier owner or note.
INSERT INTO replayable.dead_letter_history (letter_id, at, actor, action, status, owner, note)
SELECT dl.id, coalesce(dl.resolved_at, dl.created_at), coalesce(dl.resolved_by, 'unknown'),
       'recorded', dl.status, dl.owner, dl.note
FROM replayable.dead_letters dl
WHERE (dl.owner IS NOT NULL OR dl.note IS NOT NULL OR dl.status <> 'open')
  AND NOT EXISTS (SELECT 1 FROM replayable.dead_letter_history h WHERE h.letter_id = dl.id);

-- SECURITY DEFINER: a role that may change letters (the UI's, see the README) needs no right
-- on the history table, so it cannot write history rows of its own making.
CREATE OR REPLACE FUNCTION replayable.record_dead_letter_change() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO replayable.dead_letter_history (letter_id, actor, action, status, owner, note,
                                                resolution)
    VALUES (
        NEW.id,
        coalesce(nullif(current_setting('replayable.actor', true), ''), NEW.resolved_by,
                 session_user),
        CASE WHEN NEW.status IS DISTINCT FROM OLD.status THEN NEW.status
             WHEN NEW.owner IS DISTINCT FROM OLD.owner THEN 'assigned'
             ELSE 'noted' END,
        NEW.status, NEW.owner, NEW.note, NEW.resolution);
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS dead_letters_history ON replayable.dead_letters;
CREATE TRIGGER dead_letters_history AFTER UPDATE ON replayable.dead_letters
    FOR EACH ROW
    WHEN ((OLD.status, OLD.owner, OLD.note, OLD.resolution)
          IS DISTINCT FROM (NEW.status, NEW.owner, NEW.note, NEW.resolution))
    EXECUTE FUNCTION replayable.record_dead_letter_change();

CREATE OR REPLACE FUNCTION replayable.refuse_history_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'replayable.dead_letter_history is append-only';
END
$$;

DROP TRIGGER IF EXISTS dead_letter_history_append_only ON replayable.dead_letter_history;
CREATE TRIGGER dead_letter_history_append_only
    BEFORE UPDATE OR DELETE ON replayable.dead_letter_history
    FOR EACH ROW EXECUTE FUNCTION replayable.refuse_history_change();
