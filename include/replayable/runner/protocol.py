"""What a stage and the runner agree on: work items, outputs, the stage protocol, limits.

A stage is a :class:`StageSpec`; while it processes a batch it reports each item's outcome
to a :class:`BatchIO`. :class:`Limits` bound a batch, :class:`BatchResult` says where its
documents ended, and :class:`RunningBatch` is what the runner's batch lends a call of
``process``. Nothing here imports Airflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from replayable.db import Connection, Database
from replayable.keys import config_hash
from replayable.ledger import Ledger
from replayable.retry import Classified
from replayable.runner.leases import LeaseKeeper
from replayable.vocabulary import ITEM_LEASE_S, ITEM_MAX_ATTEMPTS

# The error class of a batch stopped at its run's deadline (``Limits.deadline_s``): its
# unfinished items are released, and the task fails retryably (ADR 0012).
DEADLINE = "deadline"


@dataclass(frozen=True)
class WorkItem:
    """One document's unit of work in one stage.

    ``ready``: the stage's plan found its outputs stored already (say, every chunk of the
    document embedded for another document): if its key is new, the claim records it done
    and announces it, with no lease and no ``process`` (ADR 0125); otherwise it is claimed
    and processed as any item.
    """

    doc_id: str
    item_key: str
    payload: Any = None
    ready: bool = False


@dataclass(frozen=True)
class Write:
    """Rows of one output, written with a named ``INSERT … VALUES %s … ON CONFLICT`` query."""

    query: str
    rows: list[tuple[Any, ...]]
    template: str | None = None
    size: int = 0  # bytes it holds, so that large outputs are flushed early


class SystemicStopError(Exception):
    """Raised by a stage to stop the batch for a reason that is no item's fault."""

    def __init__(self, error: Classified) -> None:
        super().__init__(f"{error.error_class}: {error.message}")
        self.error = error


class BatchIO(Protocol):
    """What a stage reports to while it processes a batch; every method is thread-safe."""

    def done(self, item: WorkItem, writes: Sequence[Write] = ()) -> None:
        """``item`` succeeded; ``writes`` are its outputs, stored with its done state."""
        ...

    def failed(self, item: WorkItem, error: BaseException) -> None:
        """``item`` failed with ``error`` (classified here; call from the except block)."""
        ...

    def holds(self, item: WorkItem) -> bool:
        """Whether this worker still holds ``item``'s lease (False: stop paying for it)."""
        ...

    def lease_valid_until(self) -> float:
        """A ``time.monotonic()`` time before which every lease of the batch is known valid.

        For work handed on ahead, to start none of it once its lease may be gone (ADR 0126).
        """
        ...

    def attempt(self, item: WorkItem) -> int:
        """The attempt number of ``item`` in this stage (1 for its first)."""
        ...

    @property
    def stopping(self) -> bool:
        """True once the batch is stopping (a systemic failure): start no new work."""
        ...

    def stop(self, error: Classified) -> None:
        """Stop the batch for a systemic reason: no item's fault, no attempt spent."""
        ...


class StageSpec(Protocol):
    """How one stage plans, keys and processes items; see ``replayable.stages.*.spec``.

    A spec subclasses this protocol, so that the two flags below keep their defaults
    unless the stage sets them (ADR 0095).
    """

    name: str
    code_version: str
    # A document's last stage: its items ending done announce ``document.ready`` (ADR 0040).
    last_stage: ClassVar[bool] = False
    # Set by a stage whose items cannot kill the task: items taken over from a holder that
    # is gone are then started together, not one at a time (ADR 0084).
    start_takeovers_together: ClassVar[bool] = False

    def key_config(self) -> dict[str, Any]:
        """The config that shapes this stage's output (part of every item key)."""
        ...

    def lineage(self) -> dict[str, Any]:
        """Key config plus the versions of the stages whose outputs this one reads."""
        ...

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        """Key the documents whose input for this stage exists; leave out the rest."""
        ...

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        """Process claimed items, reporting each one's outcome to ``io`` exactly once."""
        ...


@dataclass(frozen=True)
class Limits:
    """Per-batch bounds: lease length, attempt cap, polling, and how outcomes are flushed."""

    lease_s: float = ITEM_LEASE_S
    max_attempts: int = ITEM_MAX_ATTEMPTS
    wait_poll_s: float = 1.0
    # Outcomes are written when 1,000 are pending, or 32 MiB of output, or 2 s after the
    # first: the time bound caps the work a killed task loses, the others the size of one
    # statement. A batch that finishes within 2 s is finished in one statement.
    flush_items: int = 1000
    flush_bytes: int = 32 * 2**20
    flush_after_s: float = 2.0
    db_outage_s: float = 300.0
    # The run's deadline for this batch, from its start (None: none). Past it, no new item
    # starts, the unfinished ones are released without spending an attempt, and waiting for
    # items that another worker holds ends too, not when their leases would have expired.
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError(f"deadline_s: must be positive, got {self.deadline_s!r}")


@dataclass
class BatchResult:
    """Where every document of the batch ended in this stage."""

    stage: str
    done: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    not_entered: list[str] = field(default_factory=list)
    processed: int = 0
    skipped_done: int = 0
    retry_after_s: float | None = None
    systemic: Classified | None = None
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def entered(self) -> int:
        return len(self.done) + len(self.failed) + len(self.dead)

    def summary(self) -> dict[str, Any]:
        """Counts only: XComs stay the same size whatever the batch holds (ADR 0010)."""
        return {
            "stage": self.stage,
            "done": len(self.done),
            "failed": len(self.failed),
            "dead": len(self.dead),
            "not_entered": len(self.not_entered),
            "processed": self.processed,
            "skipped_done": self.skipped_done,
            "errors": dict(self.errors),
        }


class RunningBatch(Protocol):
    """What a call of ``process`` reads of the batch it runs in, and reports to
    (:class:`~replayable.runner.batch.Batch`)."""

    spec: StageSpec
    limits: Limits
    ends: float | None  # the batch's deadline on the monotonic clock (None: none)
    result: BatchResult
    ledger: Ledger
    leases: LeaseKeeper
    work: Database


def spec_hash(spec: StageSpec) -> str:
    """The hash a current row carries when it is done under the keys this spec derives."""
    return spec_hash_of(spec.name, spec.code_version, spec.lineage())


def spec_hash_of(stage: str, code_version: str, lineage: dict[str, Any]) -> str:
    """:func:`spec_hash` from its parts, for planners that do not build the specs."""
    return config_hash({"stage": stage, "version": code_version, **lineage})


def ready_versions(spec: StageSpec) -> dict[str, Any] | None:
    """What a ``document.ready`` event of ``spec`` names; None unless it is the last stage."""
    if not spec.last_stage:
        return None
    return {"stage": spec.name, "code_version": spec.code_version, **spec.lineage()}
