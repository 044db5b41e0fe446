-- Take a free slot of a request budget shared by every worker: the first of `slots`
-- session advisory locks in the budget's namespace that nobody holds, or none. Released
-- with release_budget_slot (or when the connection closes, e.g. the worker dies). The scan
-- starts at `start` so that workers spread over the slots; LIMIT 1 stops it at the first
-- lock taken (no sort: every row passed to a sort would take a lock).
SELECT g %% %(slots)s AS slot
FROM generate_series(%(start)s, %(start)s + %(slots)s - 1) AS g
WHERE pg_try_advisory_lock(%(namespace)s, g %% %(slots)s)
LIMIT 1
