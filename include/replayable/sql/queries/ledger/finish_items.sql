-- Record how each claimed item ended, in the caller's transaction (with the item's outputs).
-- Only the lease holder can finish an item: a worker whose lease was taken over changes
-- nothing. Outcomes: 'done'; 'failed' (dead if terminal or at the attempt cap, with an open
-- dead letter carrying the full error); 'release' (a systemic stop: failed, and the attempt
-- it took is given back; an item taken over and never started took none). Returns every key's state afterwards.
--
-- The same statement writes the outbox events these transitions announce (ADR 0040), so an
-- event is committed exactly when its state is: 'document.ready' when an item of a
-- document's last stage (announce_ready) ends done, keyed by document and spec hash, so
-- that finishing the same document under the same versions again adds nothing; and
-- 'document.failed' for each dead letter opened here, keyed by the letter. A current item
-- that ends done or dead closes its document's open letters of other keys in the stage
-- (ADR 0132): one outcome per document.
WITH input AS (
    SELECT * FROM unnest(%(keys)s::text[], %(outcomes)s::text[], %(error_classes)s::text[],
                         %(error_kinds)s::text[], %(errors)s::text[], %(tracebacks)s::text[],
                         %(retry_after_s)s::float8[])
        AS t (item_key, outcome, error_class, error_kind, error, traceback, retry_after_s)
), finished AS (
    UPDATE replayable.stage_runs s
    SET status = CASE WHEN i.outcome = 'done' THEN 'done'
                      WHEN i.outcome = 'release' THEN 'failed'
                      WHEN i.error_kind = 'terminal' OR s.attempts >= %(max_attempts)s THEN 'dead'
                      ELSE 'failed' END,
        attempts = CASE WHEN i.outcome = 'release' AND s.started_at IS NOT NULL
                        THEN greatest(s.attempts - 1, 0)
                        ELSE s.attempts END,
        error_class = i.error_class, error_kind = i.error_kind, last_error = i.error,
        -- a provider's Retry-After (at most a day): the sweep waits for it (ADR 0135)
        retry_not_before = CASE WHEN i.outcome <> 'done' AND i.retry_after_s > 0
                                THEN now() + make_interval(secs => least(i.retry_after_s, 86400))
                           END,
        lease_owner = NULL, lease_expires = NULL, finished_at = now(), updated_at = now()
    FROM input i
    WHERE s.stage = %(stage)s AND s.item_key = i.item_key
      AND s.status = 'running' AND s.lease_owner = %(owner)s
    RETURNING s.item_key, s.doc_id, s.status, s.attempts, s.code_version, s.spec_hash,
              s.is_current
), superseded AS (
    -- A current item that ends done or dead leaves its document no other open letter in
    -- the stage (ADR 0132): the claim closed those it could see; this closes one opened since.
    UPDATE replayable.dead_letters dl
    SET status = 'redriven', resolved_at = now(), resolved_by = 'rerun',
        resolution = 'superseded: the document is ' || f.status || ' in this stage as item '
                     || f.item_key || ' (code version ' || coalesce(f.code_version, '?') || ')',
        resolved_dag_id = %(dag_id)s, resolved_run_id = %(run_id)s
    FROM finished f
    WHERE f.is_current AND f.status IN ('done', 'dead')
      AND dl.stage = %(stage)s AND dl.doc_id = f.doc_id AND dl.status = 'open'
      AND dl.item_key <> f.item_key
), letters AS (
    INSERT INTO replayable.dead_letters
        (stage, item_key, doc_id, error_class, error_kind, error, traceback, attempts,
         code_version, dag_id, run_id, map_index, try_number)
    SELECT %(stage)s, f.item_key, f.doc_id, i.error_class, i.error_kind, i.error, i.traceback,
           f.attempts, f.code_version, %(dag_id)s, %(run_id)s, %(map_index)s, %(try_number)s
    FROM finished f JOIN input i USING (item_key)
    WHERE f.status = 'dead'
    ON CONFLICT (stage, item_key) WHERE status = 'open' DO NOTHING
    RETURNING *
), events AS (
    SELECT 'document.ready:' || f.doc_id || ':' || f.spec_hash AS event_key,
           'document.ready' AS event_type, f.doc_id,
           replayable.document_ready_payload(%(stage)s, f.item_key, f.spec_hash,
                                             %(versions)s::jsonb, %(dag_id)s, %(run_id)s)
               AS payload
    FROM finished f
    WHERE %(announce_ready)s AND f.status = 'done'
    UNION ALL
    SELECT 'document.failed:' || l.id, 'document.failed', l.doc_id,
           replayable.document_failed_payload(%(stage)s, l)
    FROM letters l
)
INSERT INTO replayable.outbox (event_id, event_key, event_type, aggregate_id, payload)
SELECT replayable.outbox_event_id(e.event_key), e.event_key, e.event_type, e.doc_id,
       jsonb_build_object('doc_id', e.doc_id, 'uri', d.uri) || e.payload
FROM events e
LEFT JOIN replayable.documents d ON d.doc_id = e.doc_id
ORDER BY e.event_key
ON CONFLICT (event_id) DO NOTHING;

SELECT item_key, doc_id, status, attempts,
       (status = 'running' AND lease_owner IS NOT DISTINCT FROM %(owner)s) AS mine,
       (lease_expires IS NOT NULL AND lease_expires > now()) AS lease_live
FROM replayable.stage_runs
WHERE stage = %(stage)s AND item_key = ANY(%(keys)s::text[])
