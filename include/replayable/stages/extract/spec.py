"""The extract stage as a :class:`~replayable.runner.StageSpec`: keys, input and output.

An item is one document, keyed by its bytes (doc_id), the extractor version and the engine
policy; its input is the file discover recorded, its output one ``extractions`` row, which
records the engine that read the text. Each file is checked (roots,
size) before a byte is read, then parsed by :func:`~replayable.stages.extract.pdf.extract_file`
on a pool of guarded worker processes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from replayable import guards, sources
from replayable.db import Connection, fetch_all
from replayable.keys import item_key, sha256_bytes
from replayable.retry import ItemError
from replayable.runner import BatchIO, StageSpec, WorkItem, Write
from replayable.stages import extract
from replayable.stages.extract import pdf


@dataclass
class ExtractSpec(StageSpec):
    """Extract text from each document's PDF on a pool of guarded worker processes."""

    pool: guards.GuardedPool
    max_bytes: int
    roots: Sequence[str] | None = None
    # Read when the stage is built, as the planner reads it (stages.lineage.spec_hashes).
    code_version: str = field(default_factory=lambda: extract.VERSION)
    name: str = "extract"
    # Checked page by page in the worker: a larger text layer ends ``oversize_text``.
    max_text_chars: int | None = None
    # pdfium, pypdf or auto (ADR 0103): part of the key, so another policy re-extracts.
    engine: str = extract.DEFAULT_ENGINE

    def key_config(self) -> dict[str, Any]:
        return {"engine": self.engine}

    @property
    def extractor(self) -> str:
        """The extraction's name downstream (``extract.extractor_id``)."""
        return extract.extractor_id(self.engine, self.code_version)

    def lineage(self) -> dict[str, Any]:
        return self.key_config()

    def plan(self, conn: Connection, doc_ids: Sequence[str]) -> list[WorkItem]:
        rows = fetch_all(conn, "stages/documents_by_id", {"doc_ids": list(doc_ids)})
        cfg = self.key_config()
        return [
            WorkItem(
                row["doc_id"],
                item_key(self.name, self.code_version, cfg, [row["doc_id"]]),
                row["uri"],
            )
            for row in rows
        ]

    def process(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        # One thread per guarded worker keeps every worker busy; the threads only wait. Each
        # hands its worker a few documents per round trip (ADR 0126).
        size = items_per_call(len(items), self.pool.workers)
        calls = [items[i : i + size] for i in range(0, len(items), size)]
        with ThreadPoolExecutor(self.pool.workers, thread_name_prefix="extract") as threads:
            for _ in threads.map(lambda call: self._some(call, io), calls):
                pass

    def _some(self, items: Sequence[WorkItem], io: BatchIO) -> None:
        """Extract ``items`` in one call to a worker; those it did not start go again."""
        while items and not io.stopping:  # when stopping, the runner releases the rest
            ready: list[WorkItem] = []
            for item in items:
                try:
                    if not io.holds(item):
                        raise ItemError("lease_lost", "another worker took the item over")
                    path = str(item.payload)
                    if self.roots is not None:
                        sources.check_inside(path, self.roots)
                    # Size comes from stat, before a single byte is read.
                    guards.check_size(path, self.max_bytes)
                except Exception as error:
                    io.failed(item, error)
                else:
                    ready.append(item)
            not_after = io.lease_valid_until()
            if ready and time.monotonic() > not_after:
                # A renewal is late: start nothing until one answers or the leases are lost.
                items = ready
                time.sleep(_RENEWAL_WAIT_S)
                continue
            try:
                outcomes = self.pool.run_each(
                    pdf.extract_file,
                    [
                        (str(item.payload), item.doc_id, self.max_text_chars, self.engine)
                        for item in ready
                    ],
                    not_after=not_after,
                )
            except Exception as error:  # the pool broke (BrokenProcessPool): each item hears
                for item in ready:
                    io.failed(item, error)
                return
            items = []
            for item, outcome in zip(ready, outcomes, strict=True):
                if outcome.started:
                    self._store(item, outcome, io)
                else:
                    items.append(item)

    def _store(
        self, item: WorkItem, outcome: guards.ItemOutcome[pdf.Extraction], io: BatchIO
    ) -> None:
        try:
            result = outcome.result()
        except Exception as error:
            io.failed(item, error)
            return
        row = (
            item.doc_id,
            self.extractor,
            result.page_count,
            result.text,
            sha256_bytes(result.text.encode()),
            result.removed_chars,
            result.engine,
        )
        io.done(item, [Write("stages/insert_extraction", [row], size=len(result.text))])


# How long a call waits before it looks again whether a late lease renewal has answered.
_RENEWAL_WAIT_S = 0.05
# Documents per round trip to a guarded worker: enough to hide the round trip (about 0.5 ms
# against a few ms of PDFium per document), few enough that workers finish a batch together.
ITEMS_PER_CALL = 4


def items_per_call(items: int, workers: int) -> int:
    """How many of a batch's ``items`` each call to one of ``workers`` hands over.

    At most :data:`ITEMS_PER_CALL`, and no more than a quarter of a worker's share, so that
    a batch smaller than four calls per worker still spreads over every worker.
    """
    return max(1, min(ITEMS_PER_CALL, items // (4 * max(1, workers))))
