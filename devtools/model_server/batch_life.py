"""A batch's life: its status, computed from the clock, and the lines it has done.

The phases are shares of the ``batch_delay_s`` it was created under (see
:mod:`~devtools.model_server.batches`); a cancel or an expiry keeps the lines done by then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final, cast

from devtools.model_server.api_shapes import new_id, to_bytes
from devtools.model_server.batch_lines import BATCH_ENDPOINT, Plan
from devtools.model_server.errors import HttpError

COMPLETION_WINDOW_S = 24 * 3600

VALIDATING: Final = "validating"
FAILED: Final = "failed"
IN_PROGRESS: Final = "in_progress"
FINALIZING: Final = "finalizing"
COMPLETED: Final = "completed"
EXPIRED: Final = "expired"
CANCELLING: Final = "cancelling"
CANCELLED: Final = "cancelled"
ENDED = (COMPLETED, EXPIRED, CANCELLED, FAILED)

# Where the phases of a batch end, as shares of its batch_delay_s.
_VALIDATED = 0.25
_PROCESSED = 0.75
_CANCELLING = 0.25

_EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


def _share_of(count: int, share: float) -> int:
    """``share`` of ``count`` lines, rounded down (0.6 of 10 is 6, not 5 from 5.9999…)."""
    return max(0, min(count, math.floor(share * count + 1e-9)))


@dataclass
class Batch:
    """A batch and the faults it runs under; its status is computed from the clock.

    ``started`` and ``cancel_requested`` are ``time.monotonic()`` readings, ``created_at``
    the wall clock at ``started``. Changed only under the :class:`BatchStore` lock.
    """

    id: str
    input_file_id: str
    completion_window: str
    metadata: dict[str, str] | None
    created_at: float
    started: float
    delay_s: float
    plan: Plan
    expire_fraction: float | None
    cancel_fraction: float | None
    # Indexes of the plan's lines a completed batch charges but writes to no file.
    lost_lines: frozenset[int] = frozenset()
    cancel_requested: float | None = None
    done_when_cancelled: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    finished: bool = False

    def _planned(self) -> int:
        """How many lines are done by the end, unless a cancel stops it first."""
        if self.expire_fraction is None:
            return self.plan.total
        return _share_of(self.plan.total, self.expire_fraction)

    def status(self, now: float) -> str:
        """The status at monotonic time ``now``."""
        delay = self.delay_s
        if self.cancel_requested is not None:
            ends = self.cancel_requested + delay * _CANCELLING
            return CANCELLED if now >= ends else CANCELLING
        elapsed = now - self.started
        if elapsed < delay * _VALIDATED:
            return VALIDATING
        if self.plan.errors:
            return FAILED
        if self.expire_fraction is not None:
            return IN_PROGRESS if elapsed < delay else EXPIRED
        if elapsed < delay * _PROCESSED:
            return IN_PROGRESS
        return FINALIZING if elapsed < delay else COMPLETED

    def processed(self, now: float, status: str) -> int:
        """How many lines, first in file order, are done at ``now``."""
        if status in (VALIDATING, FAILED):
            return 0
        if status in (CANCELLING, CANCELLED):
            return self.done_when_cancelled
        planned = self._planned()
        if status != IN_PROGRESS:
            return planned
        start = self.delay_s * _VALIDATED
        end = self.delay_s * (1.0 if self.expire_fraction is not None else _PROCESSED)
        share = (now - self.started - start) / (end - start) if end > start else 1.0
        return _share_of(planned, share)

    def cancel(self, now: float) -> None:
        """Cancel the batch at ``now``; raise a 409 :class:`HttpError` if it is too late."""
        status = self.status(now)
        if status in (CANCELLING, CANCELLED):
            return
        if status not in (VALIDATING, IN_PROGRESS):
            raise HttpError(
                409,
                f"cannot cancel batch {self.id}: its status is {status!r}; only a "
                "validating or in_progress batch can be cancelled",
                code="batch_not_cancellable",
            )
        if self.plan.errors:
            done = 0
        elif self.cancel_fraction is not None:
            done = min(self._planned(), _share_of(self.plan.total, self.cancel_fraction))
        else:
            done = self.processed(now, status)
        self.cancel_requested = now
        self.done_when_cancelled = done

    def to_json(self, now: float) -> dict[str, Any]:
        """The OpenAI batch object at monotonic time ``now``."""
        status = self.status(now)
        delay = self.delay_s

        def at(offset: float) -> int:
            return int(self.created_at + offset)

        cancel_offset = (
            None if self.cancel_requested is None else self.cancel_requested - self.started
        )
        validated = not self.plan.errors and (
            now - self.started >= delay * _VALIDATED
            and (cancel_offset is None or cancel_offset >= delay * _VALIDATED)
        )
        done = self.processed(now, status)
        succeeded = self.plan.succeeding[done]
        counting = status not in (VALIDATING, FAILED)
        expires = delay if self.expire_fraction is not None else COMPLETION_WINDOW_S
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": BATCH_ENDPOINT,
            "errors": (
                {"object": "list", "data": list(self.plan.errors)} if status == FAILED else None
            ),
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": at(0),
            "in_progress_at": at(delay * _VALIDATED) if validated else None,
            "expires_at": at(expires),
            "finalizing_at": at(delay * _PROCESSED) if status in (FINALIZING, COMPLETED) else None,
            "completed_at": at(delay) if status == COMPLETED else None,
            "failed_at": at(delay * _VALIDATED) if status == FAILED else None,
            "expired_at": at(delay) if status == EXPIRED else None,
            "cancelling_at": None if cancel_offset is None else at(cancel_offset),
            "cancelled_at": (
                at(cast(float, cancel_offset) + delay * _CANCELLING)
                if status == CANCELLED
                else None
            ),
            "request_counts": {
                "total": self.plan.total if counting else 0,
                "completed": succeeded if counting else 0,
                "failed": done - succeeded if counting else 0,
            },
            "metadata": self.metadata,
        }


def result_line(custom_id: str, status: int, body: object) -> bytes:
    return to_bytes(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": new_id("req_"), "body": body},
            "error": None,
        }
    )


def expired_line(custom_id: str) -> bytes:
    return to_bytes(
        {
            "id": new_id("batch_req_"),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": "batch_expired", "message": _EXPIRED_MESSAGE},
        }
    )
