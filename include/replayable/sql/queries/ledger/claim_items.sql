-- Claim a batch's items in one round trip (ADR 0002, 0009). Statements run in order in one
-- implicit transaction, each seeing the ones before:
-- 1. the keys given become each document's current row in this stage;
-- 2. new items enter already claimed by this worker (one write per new item), except the
--    ones the stage found ready (their outputs are stored already: ADR 0125), which enter
--    done, with the document.ready event a last stage announces, as finish_items.sql writes;
-- 3. existing items are taken when nobody holds a live lease on them, or when the holder is
--    an earlier try of this same task instance (Airflow only starts a new try once it has
--    given up on the old one), or, in a revive, when they are dead (fresh attempt budget);
--    an item's row takes the current spec_hash: the same key under a new lineage (say, a new
--    extractor that gave the same text) is the same output, so done stays done;
--    a running item whose holder is gone (as above) and that is already at the attempt cap
--    is not taken again: it ends dead as `killed`, with a dead letter that names the last
--    holder and its try, and its document.failed event (ADR 0084), so an item that kills
--    its worker every time is not taken over forever; below the cap it is taken over
--    *unstarted* (started_at NULL, no attempt spent): the runner starts such items one at a
--    time, spending the attempt just before the work (start_items.sql), so that a task
--    killed by one item costs its unstarted batch-mates nothing;
-- 4. a document whose current item in this stage is now done (found ready, or done under
--    another spec) or held by this worker has no open dead letter left in the stage
--    (ADR 0132): a revive closes them as redriven by its run (ADR 0083), any other run as
--    superseded by the document's current item;
-- 5. the state of every key is returned; `mine` marks the ones this worker now holds.
-- First, the batch's documents in this stage are locked for the transaction, in doc_id order
-- (so two claims never wait on each other in a cycle): two claims of one document, say by
-- runs at two code versions, take turns instead of both moving its current row and one
-- failing on stage_runs_current_uq (ADR 0084; the ledger's retry stays as a backstop).
SELECT count(pg_advisory_xact_lock(hashtextextended('replayable.claim:' || %(stage)s || ':' || doc_id, 0)))
FROM (SELECT DISTINCT doc_id FROM unnest(%(doc_ids)s::text[]) AS t (doc_id) ORDER BY doc_id) AS d;

WITH input AS (
    SELECT * FROM unnest(%(keys)s::text[], %(doc_ids)s::text[]) AS t (item_key, doc_id)
)
UPDATE replayable.stage_runs s SET is_current = false
FROM input
WHERE s.stage = %(stage)s AND s.doc_id = input.doc_id AND s.is_current
  AND s.item_key <> input.item_key;

WITH inserted AS (
    INSERT INTO replayable.stage_runs
        (stage, item_key, doc_id, status, attempts, code_version, config_hash, spec_hash,
         is_current, lease_owner, lease_expires, dag_id, run_id, map_index, try_number,
         started_at, finished_at)
    SELECT %(stage)s, item_key, doc_id, CASE WHEN ready THEN 'done' ELSE 'running' END,
           CASE WHEN ready THEN 0 ELSE 1 END, %(code_version)s, %(config_hash)s,
           %(spec_hash)s, true, CASE WHEN ready THEN NULL ELSE %(owner)s END,
           CASE WHEN ready THEN NULL ELSE now() + make_interval(secs => %(lease_s)s) END,
           %(dag_id)s, %(run_id)s, %(map_index)s, %(try_number)s,
           CASE WHEN ready THEN NULL ELSE now() END, CASE WHEN ready THEN now() END
    FROM unnest(%(keys)s::text[], %(doc_ids)s::text[], %(ready)s::boolean[])
        AS t (item_key, doc_id, ready)
    ON CONFLICT DO NOTHING
    RETURNING item_key, doc_id, status, spec_hash
)
INSERT INTO replayable.outbox (event_id, event_key, event_type, aggregate_id, payload)
SELECT replayable.outbox_event_id(e.event_key), e.event_key, 'document.ready', e.doc_id,
       jsonb_build_object('doc_id', e.doc_id, 'uri', d.uri)
       || replayable.document_ready_payload(%(stage)s, e.item_key, e.spec_hash,
                                            %(versions)s::jsonb, %(dag_id)s, %(run_id)s)
FROM (SELECT 'document.ready:' || i.doc_id || ':' || i.spec_hash AS event_key, i.*
      FROM inserted i WHERE %(announce_ready)s AND i.status = 'done') e
LEFT JOIN replayable.documents d ON d.doc_id = e.doc_id
ORDER BY e.event_key
ON CONFLICT (event_id) DO NOTHING;

WITH takeable AS (
    SELECT s.item_key, s.doc_id, s.attempts, s.code_version, s.lease_owner, s.dag_id,
           s.run_id, s.map_index, s.try_number,
           (s.status = 'running'
            AND (s.lease_expires IS NULL OR s.lease_expires <= now()
                 OR (s.dag_id = %(dag_id)s AND s.run_id = %(run_id)s
                     AND s.map_index IS NOT DISTINCT FROM %(map_index)s
                     AND s.try_number < %(try_number)s))) AS orphaned,
           (s.status IN ('pending', 'failed') OR (%(revive)s AND s.status = 'dead')) AS open
    FROM replayable.stage_runs s
    WHERE s.stage = %(stage)s AND s.item_key = ANY(%(keys)s::text[])
      AND NOT (s.status = 'running' AND s.lease_owner = %(owner)s)
      -- a current done row under this spec stays as it is: nothing to lock or write
      AND NOT (s.status = 'done' AND s.is_current
               AND s.spec_hash IS NOT DISTINCT FROM %(spec_hash)s)
    FOR UPDATE
), decided AS (
    SELECT t.*,
           t.open OR (t.orphaned AND t.attempts < %(max_attempts)s) AS claim,
           t.orphaned AND t.attempts >= %(max_attempts)s AS killed,
           'the task holding this item stopped without finishing it, '
               || t.attempts || ' of ' || %(max_attempts)s || ' attempts (the cap): last held by '
               || coalesce(t.lease_owner, '?') || ', run ' || coalesce(t.run_id, '?')
               || ', map index ' || coalesce(t.map_index::text, '?')
               || ', try ' || coalesce(t.try_number::text, '?')
               || '; an item that kills or stalls its task every time ends here' AS message
    FROM takeable t
), taken AS (
    UPDATE replayable.stage_runs s
    SET is_current = true,
        status = CASE WHEN d.claim THEN 'running' WHEN d.killed THEN 'dead' ELSE s.status END,
        attempts = CASE WHEN NOT d.claim OR NOT d.open THEN s.attempts
                        WHEN s.status = 'dead' THEN 1
                        ELSE s.attempts + 1 END,
        error_class = CASE WHEN d.claim AND s.status = 'dead' THEN NULL
                           WHEN d.killed THEN 'killed' ELSE s.error_class END,
        error_kind = CASE WHEN d.killed THEN 'terminal' ELSE s.error_kind END,
        last_error = CASE WHEN d.killed THEN d.message ELSE s.last_error END,
        lease_owner = CASE WHEN d.claim THEN %(owner)s WHEN d.killed THEN NULL
                           ELSE s.lease_owner END,
        lease_expires = CASE WHEN d.claim THEN now() + make_interval(secs => %(lease_s)s)
                             WHEN d.killed THEN NULL ELSE s.lease_expires END,
        spec_hash = %(spec_hash)s,
        dag_id = CASE WHEN d.claim THEN %(dag_id)s ELSE s.dag_id END,
        -- a run of another pipeline takes over what this one's left: that pipeline's sweep
        -- finishes its own later stages once this stage is done (ADR 0135)
        left_by = CASE WHEN d.claim AND s.dag_id <> %(dag_id)s
                            AND NOT s.dag_id = ANY(coalesce(s.left_by, '{}'))
                       THEN array_append(s.left_by, s.dag_id) ELSE s.left_by END,
        run_id = CASE WHEN d.claim THEN %(run_id)s ELSE s.run_id END,
        map_index = CASE WHEN d.claim THEN %(map_index)s ELSE s.map_index END,
        try_number = CASE WHEN d.claim THEN %(try_number)s ELSE s.try_number END,
        started_at = CASE WHEN d.claim AND d.open THEN now()
                          WHEN d.claim THEN NULL ELSE s.started_at END,
        finished_at = CASE WHEN d.claim THEN NULL WHEN d.killed THEN now()
                           ELSE s.finished_at END,
        updated_at = CASE WHEN d.claim OR d.killed THEN now() ELSE s.updated_at END
    FROM decided d
    WHERE s.stage = %(stage)s AND s.item_key = d.item_key
      AND (d.claim OR d.killed OR NOT s.is_current OR s.spec_hash IS DISTINCT FROM %(spec_hash)s)
    RETURNING s.item_key
), letters AS (
    INSERT INTO replayable.dead_letters
        (stage, item_key, doc_id, error_class, error_kind, error, traceback, attempts,
         code_version, dag_id, run_id, map_index, try_number)
    SELECT %(stage)s, d.item_key, d.doc_id, 'killed', 'terminal', d.message, NULL, d.attempts,
           d.code_version, d.dag_id, d.run_id, d.map_index, d.try_number
    FROM decided d
    WHERE d.killed
    ON CONFLICT (stage, item_key) WHERE status = 'open' DO NOTHING
    RETURNING *
)
INSERT INTO replayable.outbox (event_id, event_key, event_type, aggregate_id, payload)
SELECT replayable.outbox_event_id('document.failed:' || l.id), 'document.failed:' || l.id,
       'document.failed', l.doc_id,
       jsonb_build_object('doc_id', l.doc_id, 'uri', doc.uri)
           || replayable.document_failed_payload(%(stage)s, l)
FROM letters l
LEFT JOIN replayable.documents doc ON doc.doc_id = l.doc_id
ORDER BY l.id
ON CONFLICT (event_id) DO NOTHING;

UPDATE replayable.dead_letters d
SET status = 'redriven', resolved_at = now(),
    resolved_by = CASE WHEN %(revive)s THEN %(revive_by)s ELSE 'rerun' END,
    resolution = CASE WHEN %(revive)s THEN %(revive_reason)s
                      ELSE 'superseded: the document is '
                           || CASE WHEN s.status = 'done' THEN 'done'
                                   WHEN s.status = 'dead' THEN 'dead again'
                                   ELSE 'at work again' END
                           || ' in this stage as item ' || s.item_key
                           || ' (code version ' || %(code_version)s || ')' END,
    resolved_dag_id = %(dag_id)s, resolved_run_id = %(run_id)s
FROM replayable.stage_runs s
WHERE d.stage = %(stage)s AND d.status = 'open'
  AND s.stage = %(stage)s AND s.item_key = ANY(%(keys)s::text[]) AND s.is_current
  AND (s.status = 'done' OR (s.status = 'running' AND s.lease_owner = %(owner)s)
       OR (s.status = 'dead' AND d.item_key <> s.item_key))
  AND d.doc_id = s.doc_id;

-- 4b. A document whose current item is dead again (a run under the settings or version it
-- died under, which does not revive it) gets that item's letter back: its newest letter,
-- open once more as a new row (the closed one keeps its resolution), and a document.failed
-- event for it; a letter ignored on purpose stays ignored (ADR 0132).
WITH reopened AS (
    INSERT INTO replayable.dead_letters
        (stage, item_key, doc_id, error_class, error_kind, error, traceback, attempts,
         code_version, dag_id, run_id, map_index, try_number)
    SELECT %(stage)s, s.item_key, s.doc_id,
           coalesce(l.error_class, nullif(s.error_class, ''), 'unknown'),
           coalesce(l.error_kind, s.error_kind, 'terminal'),
           coalesce(l.error, s.last_error, 'dead'), l.traceback, s.attempts, s.code_version,
           s.dag_id, s.run_id, s.map_index, s.try_number
    FROM replayable.stage_runs s
    LEFT JOIN LATERAL (
        SELECT * FROM replayable.dead_letters p
        WHERE p.stage = %(stage)s AND p.item_key = s.item_key
        ORDER BY p.id DESC LIMIT 1
    ) l ON true
    WHERE s.stage = %(stage)s AND s.item_key = ANY(%(keys)s::text[]) AND s.is_current
      AND s.status = 'dead'
      AND NOT EXISTS (
          SELECT 1 FROM replayable.dead_letters o
          WHERE o.stage = %(stage)s AND o.item_key = s.item_key
            AND o.status IN ('open', 'ignored'))
    ON CONFLICT (stage, item_key) WHERE status = 'open' DO NOTHING
    RETURNING *
)
INSERT INTO replayable.outbox (event_id, event_key, event_type, aggregate_id, payload)
SELECT replayable.outbox_event_id('document.failed:' || l.id), 'document.failed:' || l.id,
       'document.failed', l.doc_id,
       jsonb_build_object('doc_id', l.doc_id, 'uri', doc.uri)
           || replayable.document_failed_payload(%(stage)s, l)
FROM reopened l
LEFT JOIN replayable.documents doc ON doc.doc_id = l.doc_id
ORDER BY l.id
ON CONFLICT (event_id) DO NOTHING;

SELECT item_key, doc_id, status, attempts,
       (status = 'running' AND lease_owner IS NOT DISTINCT FROM %(owner)s) AS mine,
       (lease_expires IS NOT NULL AND lease_expires > now()) AS lease_live,
       (status = 'running' AND lease_owner IS NOT DISTINCT FROM %(owner)s
        AND started_at IS NULL) AS unstarted
FROM replayable.stage_runs
WHERE stage = %(stage)s AND item_key = ANY(%(keys)s::text[])
