"""A run's own deadline for one batch: the stage stops, its unfinished items go back.

Airflow's ``execution_timeout`` is fixed when the DAG is parsed and kills the task where it
stands; the deadline here comes from the run's params (``PipelineSettings.batch_deadline_s``)
and ends the batch the way a systemic failure does: no new item starts, the items not yet
finished are released without spending an attempt, and the task fails retryably (ADR 0012).
Nothing here imports Airflow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from replayable.db import Connection
from replayable.retry import Classified, ErrorKind
from replayable.runner import DEADLINE, BatchIO, StageSpec, WorkItem

ERROR_CLASS = DEADLINE


class DeadlineSpec:
    """``spec`` with a deadline: once ``seconds`` have passed, the batch is stopped.

    The clock starts when this object is made. Items already in flight finish (each is
    bounded by its own item timeout or request timeout); nothing new is started.

    :param spec: the stage to run.
    :param seconds: the run's deadline for this batch, from now.
    """

    def __init__(self, spec: StageSpec, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError(f"seconds: must be positive, got {seconds!r}")
        self.spec = spec
        self.name = spec.name
        self.code_version = spec.code_version
        self.seconds = seconds
        self._ends = time.monotonic() + seconds

    def __getattr__(self, name: str) -> Any:
        # Whatever else the wrapped stage says of itself (``last_stage``, ADR 0040, and any
        # flag added later) shows through: the deadline changes when it stops, nothing else.
        if name == "spec":  # not set yet: during unpickling or a failed __init__
            raise AttributeError(name)
        return getattr(self.spec, name)

    def key_config(self) -> dict[str, Any]:
        return self.spec.key_config()

    def lineage(self) -> dict[str, Any]:
        return self.spec.lineage()

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        return self.spec.plan(conn, doc_ids)

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        error = Classified(
            ERROR_CLASS,
            ErrorKind.SYSTEMIC,
            f"the batch ran past this run's deadline of {self.seconds:.0f} s; its unfinished "
            "items were released for the next try",
        )
        remaining = self._ends - time.monotonic()
        if remaining <= 0:
            io.stop(error)  # before the stage starts anything
        timer = threading.Timer(max(remaining, 0.0), io.stop, (error,))
        timer.daemon = True
        timer.start()
        try:
            self.spec.process(items, io)
        finally:
            timer.cancel()
