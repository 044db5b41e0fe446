-- Spend `tokens` of the tokens-per-minute budget `name` (replayable.budget, ADR 0106). The
-- row's next_at is the time by which every token spent so far is paid for at the budget's
-- rate (`seconds_per_token` = 60 / max_tpm). A request may go once what is owed before it
-- is within `tolerance_s` of now; its own tokens are added at once, so the next request waits
-- for them. Returns how long the caller waits before sending. The row is created on first use.
INSERT INTO replayable.request_rates AS r (name, next_at)
VALUES (%(name)s, clock_timestamp() + make_interval(secs => %(tokens)s * %(seconds_per_token)s))
ON CONFLICT (name) DO UPDATE
    SET next_at = greatest(r.next_at, clock_timestamp())
        + make_interval(secs => %(tokens)s * %(seconds_per_token)s)
RETURNING greatest(
    0,
    extract(epoch FROM r.next_at - clock_timestamp())
        - %(tokens)s * %(seconds_per_token)s - %(tolerance_s)s
)::float8 AS wait_s
