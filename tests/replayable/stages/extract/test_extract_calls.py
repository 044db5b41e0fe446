"""The extract stage hands its guarded workers a few documents per call (ADR 0126).

What a call of several documents must keep from one call per document: each document's
own limits and error class, one outcome per document, and no document started once its
lease may be gone. Run through ``ExtractSpec.process`` and a real ``GuardedPool``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import corpus
from replayable.guards import GuardedPool, GuardError
from replayable.keys import sha256_bytes
from replayable.retry import Classified
from replayable.runner import WorkItem, Write
from replayable.stages.extract.spec import ExtractSpec, items_per_call

# The containment tier: a document here blows its worker's memory limit on purpose.
pytestmark = pytest.mark.containment


class Reports:
    """A BatchIO that records each item's outcome; its leases are valid from ``valid_from``."""

    def __init__(self, valid_from: float = 0.0) -> None:
        self.writes: dict[str, list[Write]] = {}
        self.errors: dict[str, BaseException] = {}
        self.valid_from = valid_from
        self._lock = threading.Lock()

    def done(self, item: WorkItem, writes: Sequence[Write] = ()) -> None:
        with self._lock:
            assert item.doc_id not in self.writes and item.doc_id not in self.errors
            self.writes[item.doc_id] = list(writes)

    def failed(self, item: WorkItem, error: BaseException) -> None:
        with self._lock:
            assert item.doc_id not in self.writes and item.doc_id not in self.errors
            self.errors[item.doc_id] = error

    def holds(self, item: WorkItem) -> bool:
        return True

    def lease_valid_until(self) -> float:
        # Before valid_from, a renewal is late: nothing known valid. After it, a minute ahead.
        now = time.monotonic()
        return now - 1 if now < self.valid_from else now + 60

    def attempt(self, item: WorkItem) -> int:
        return 1

    @property
    def stopping(self) -> bool:
        return False

    def stop(self, error: Classified) -> None:
        raise AssertionError(f"nothing here is systemic: {error}")


def _items(folder: Path, clean: int, poison_at: int | None = None) -> list[WorkItem]:
    paths = [
        corpus.write_pdf(folder / f"doc{i}.pdf", [f"Document {i} says {i * 7} things."])
        for i in range(clean)
    ]
    if poison_at is not None:
        bomb = folder / "bomb.pdf"
        bomb.write_bytes(corpus.memory_bomb_pdf_bytes(pages=1))
        paths.insert(poison_at, bomb)
    return [
        WorkItem(sha256_bytes(path.read_bytes()), f"key-{n}", str(path))
        for n, path in enumerate(paths)
    ]


def _spy_calls(pool: GuardedPool) -> list[tuple[int, float | None, float]]:
    """Record each run_each call as (documents, not_after, when it was made)."""
    calls: list[tuple[int, float | None, float]] = []
    run_each = pool.run_each

    def spy(fn: Any, args: Sequence[tuple[Any, ...]], **kwargs: Any) -> Any:
        calls.append((len(args), kwargs.get("not_after"), time.monotonic()))
        return run_each(fn, args, **kwargs)

    pool.run_each = spy  # type: ignore[method-assign]
    return calls


def test_a_document_that_kills_its_worker_fails_alone_among_the_documents_of_its_call(
    tmp_path: Path,
) -> None:
    """Seventeen documents on one worker go four to a call; the memory bomb, third of the
    second call, kills the worker (PDFium aborts at the limit). It alone ends ``memory``;
    the documents of its call before and after it are extracted on the replacement worker."""
    items = _items(tmp_path, clean=16, poison_at=6)
    reports = Reports()
    with GuardedPool(timeout_s=60, memory_mb=256, workers=1) as pool:
        calls = _spy_calls(pool)
        ExtractSpec(pool=pool, max_bytes=2**20).process(items, reports)
    # The second call died on its third document: its first two and its last went again.
    assert [documents for documents, _, _ in calls] == [4, 4, 2, 1, 4, 4, 1]
    bomb = items[6].doc_id
    assert set(reports.errors) == {bomb}
    assert isinstance(reports.errors[bomb], GuardError)
    assert reports.errors[bomb].error_class == "memory"
    assert set(reports.writes) == {item.doc_id for item in items} - {bomb}
    for n, item in enumerate(i for i in items if i.doc_id != bomb):
        (write,) = reports.writes[item.doc_id]
        assert f"Document {n} says {n * 7} things." in write.rows[0][3]


def test_no_document_is_started_while_its_lease_is_not_known_to_be_valid(
    tmp_path: Path,
) -> None:
    """A late lease renewal holds the documents back; once one answers, they all end done."""
    items = _items(tmp_path, clean=8)
    reports = Reports(valid_from=time.monotonic() + 0.5)
    with GuardedPool(timeout_s=60, memory_mb=None, workers=2) as pool:
        calls = _spy_calls(pool)
        ExtractSpec(pool=pool, max_bytes=2**20).process(items, reports)
    assert set(reports.writes) == {item.doc_id for item in items} and not reports.errors
    assert calls and all(not_after is not None and not_after > made for _, not_after, made in calls)
    assert min(made for _, _, made in calls) >= reports.valid_from


def test_a_call_holds_a_few_documents_and_spreads_a_small_batch_over_every_worker() -> None:
    assert items_per_call(1, 2) == 1
    assert items_per_call(7, 2) == 1  # fewer than four calls per worker: one by one
    assert items_per_call(16, 2) == 2
    assert items_per_call(1000, 2) == 4
    assert items_per_call(50, 8) == 1
