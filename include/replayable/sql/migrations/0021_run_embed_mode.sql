-- The embed mode a run ran in (ADR 0130), recorded by its plan: the sweep re-runs the items
-- a run left in the mode that run used, so that a batch's chunks are not bought in sync mode.
ALTER TABLE replayable.runs ADD COLUMN IF NOT EXISTS embed_mode text;
