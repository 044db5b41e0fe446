-- One billable HTTP request and the items whose inputs rode in it, in one round trip;
-- searched_by names who asked a search's question (ADR 0153), NULL for the pipeline's calls.
WITH call AS (
    INSERT INTO replayable.model_calls
        (stage, item_key, attempt, call_try, status, http_status, latency_ms, n_inputs, tokens,
         idempotency_key, run_id, model, output_tokens, cost_usd, mode, searched_by)
    VALUES (%(stage)s, %(item_key)s, %(attempt)s, %(call_try)s, %(status)s, %(http_status)s,
            %(latency_ms)s, %(n_inputs)s, %(tokens)s, %(idempotency_key)s, %(run_id)s,
            %(model)s, %(output_tokens)s, %(cost_usd)s, %(mode)s, %(searched_by)s)
    RETURNING id
)
INSERT INTO replayable.model_call_items (call_id, item_key, n_inputs, tokens)
SELECT call.id, u.item_key, u.n_inputs, u.tokens
FROM call, unnest(%(item_keys)s::text[], %(item_inputs)s::int[], %(item_tokens)s::int[])
    AS u (item_key, n_inputs, tokens)
