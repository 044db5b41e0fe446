INSERT INTO replayable.model_calls
    (stage, item_key, attempt, call_try, status, http_status, latency_ms, n_inputs, tokens,
     idempotency_key, run_id)
VALUES (%(stage)s, %(item_key)s, %(attempt)s, %(call_try)s, %(status)s, %(http_status)s,
        %(latency_ms)s, %(n_inputs)s, %(tokens)s, %(idempotency_key)s, %(run_id)s)
