-- How long each of the check's statements may take, for this transaction only (a check reads
-- the whole ledger: seconds at a million documents, past the UI's usual statement timeout).
SELECT set_config('statement_timeout', %(ms)s, true)
