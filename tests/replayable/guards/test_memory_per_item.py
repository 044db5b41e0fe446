"""One item's memory is never charged to the next item of its call (ADR 0126).

Items of a ``run_each`` call share a worker, and the results of the first ones stay in it
until the call returns. An item that runs out of memory behind them has not broken its own
limit: it runs again alone, and only a breach alone is its ``memory``.
"""

from __future__ import annotations

from typing import Any

from replayable.guards import GuardedPool, GuardError

LIMIT_MB = 400


def item(what: str, megabytes: int) -> Any:
    """A result of ``megabytes`` (kept by the worker until its call returns), or a peak of
    ``megabytes`` allocated in steps, as a parser's, and given back."""
    if what == "result":
        return bytes(megabytes * 2**20)
    chunks = [bytearray(16 * 2**20) for _ in range(megabytes // 16)]
    return len(chunks)


def test_an_item_that_fits_alone_is_not_failed_by_a_batch_mates_result() -> None:
    with GuardedPool(timeout_s=60, memory_mb=LIMIT_MB) as pool:
        assert pool.run(item, "peak", 300) == 300 // 16  # it fits the limit alone
        outcomes = pool.run_each(item, [("result", 95), ("peak", 300), ("result", 1)])
        assert len(outcomes[0].result()) == 95 * 2**20
        assert outcomes[1].result() == 300 // 16
        assert len(outcomes[2].result()) == 2**20


def test_an_item_that_does_not_fit_alone_is_still_memory() -> None:
    with GuardedPool(timeout_s=60, memory_mb=LIMIT_MB) as pool:
        outcomes = pool.run_each(item, [("result", 95), ("peak", 2 * LIMIT_MB), ("result", 1)])
        assert len(outcomes[0].result()) == 95 * 2**20
        failed = outcomes[1].error
        assert isinstance(failed, GuardError) and failed.error_class == "memory"
        assert len(outcomes[2].result()) == 2**20
