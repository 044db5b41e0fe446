-- Reserve a send time in the request-rate budget `name`: requests are spaced `interval_s`
-- apart (1 / max_rps), and up to `burst` of them may go back to back after a quiet spell.
-- One statement, one row lock held for microseconds (run it on a connection of its own that
-- commits at once); returns how long the caller waits before sending. The row is created on
-- first use.
INSERT INTO replayable.request_rates AS r (name, next_at)
VALUES (%(name)s, clock_timestamp() + make_interval(secs => %(interval_s)s))
ON CONFLICT (name) DO UPDATE
    SET next_at = greatest(r.next_at, clock_timestamp()) + make_interval(secs => %(interval_s)s)
RETURNING greatest(
    0, extract(epoch FROM r.next_at - clock_timestamp()) - %(burst)s * %(interval_s)s
)::float8 AS wait_s
