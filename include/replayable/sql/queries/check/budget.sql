-- What the check's statements may use, for its transaction only: memory for the hash joins
-- that read every current row once (instead of spilling them to disk in batches), and, when
-- `ms` is given, a statement timeout of its own (a check reads the whole ledger: seconds at
-- a million documents, past the UI's usual statement timeout).
SELECT set_config('work_mem', %(work_mem)s, true),
       CASE WHEN %(ms)s::text IS NOT NULL THEN set_config('statement_timeout', %(ms)s, true) END
