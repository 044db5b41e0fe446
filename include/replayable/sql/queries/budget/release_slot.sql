SELECT pg_advisory_unlock(%(namespace)s, %(slot)s)
