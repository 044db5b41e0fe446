"""Run one stage over one batch of documents, with the effect of running it once.

Per batch: plan the items (one key per document for this stage), then claim them all in
one round trip (registering new ones); items that are done, dead, or leased by another
worker are not processed. The stage processes the claimed items however suits it (the
extract stage on a pool of guarded processes, the embed stage as packed requests in
flight at once) and reports each item's outcome to a :class:`BatchIO`. Outcomes are
flushed in groups: the items' outputs (keyed, ``ON CONFLICT DO NOTHING``) and their new
states go in one transaction. A failure is classified: retryable (failed, or dead at the
attempt cap), terminal (dead at once) or systemic (the batch stops and the items keep their
attempts). A thread renews the leases of the items still in progress and tells the stage
which ones were lost, so that it stops paying for them. Nothing here imports Airflow.

- ``protocol``: what a stage and the runner agree on (``StageSpec``, ``BatchIO``, ``Limits``);
- ``batch``: :func:`run_batch`, the batch from plan to its last outcome;
- ``processing``: one call of a stage's ``process`` and the flushes of its outcomes;
- ``leases``: the thread that renews leases.
"""

from __future__ import annotations

from replayable.ledger import Revival
from replayable.runner.batch import run_batch
from replayable.runner.protocol import (
    DEADLINE,
    BatchIO,
    BatchResult,
    Limits,
    StageSpec,
    SystemicStopError,
    WorkItem,
    Write,
    ready_versions,
    spec_hash,
    spec_hash_of,
)

__all__ = [
    "DEADLINE",
    "BatchIO",
    "BatchResult",
    "Limits",
    "Revival",
    "StageSpec",
    "SystemicStopError",
    "WorkItem",
    "Write",
    "ready_versions",
    "run_batch",
    "spec_hash",
    "spec_hash_of",
]
