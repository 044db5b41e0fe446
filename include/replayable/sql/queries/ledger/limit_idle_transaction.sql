-- End this session if its transaction sits idle (waiting for the client) longer than `ms`
-- milliseconds, for the rest of the transaction only. A worker frozen mid-request then
-- loses its chunk locks and budget slot instead of holding them until TCP gives up.
SELECT set_config('idle_in_transaction_session_timeout', %(ms)s, true)
