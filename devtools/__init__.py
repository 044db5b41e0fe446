"""Development tooling: the local services, the fake model server and the ledger resets.

Not shipped: the wheel packages ``include/replayable`` only. These modules assume a source
checkout (the repository root on ``sys.path``) and may import dev-only packages (pgserver).
"""
