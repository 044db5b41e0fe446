-- Correct a tokens-per-minute budget once the provider said what a request used: give back
-- the seconds of `tokens` reserved and not used (negative: charge what the estimate missed).
UPDATE replayable.request_rates
SET next_at = next_at - make_interval(secs => %(tokens)s * %(seconds_per_token)s)
WHERE name = %(name)s
