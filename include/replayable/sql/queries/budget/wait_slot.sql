-- Wait for one slot of a request budget (all were taken): Postgres queues the waiters.
SELECT pg_advisory_lock(%(namespace)s, %(slot)s)
