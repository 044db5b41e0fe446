"""What the embed stage's two modes read of its spec, below the spec that dispatches to them.

:class:`~replayable.stages.embed.spec.EmbedSpec` holds these settings and hands itself to
the sync mode (:mod:`.sync`) or the batch mode (:mod:`.batch`); they read it through
:class:`EmbedConfig`, so neither imports the spec (ADR 0157).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from replayable.budget import RequestBudget
from replayable.db import Database
from replayable.models.batch_api import (
    MAX_BATCH_BYTES,
    MAX_BATCH_INPUTS,
    MAX_BATCH_REQUESTS,
    BatchApi,
)
from replayable.models.embeddings import EmbeddingProvider


@dataclass(frozen=True)
class BatchLimits:
    """What one provider batch may hold: requests, embedding inputs, file bytes."""

    requests: int = MAX_BATCH_REQUESTS
    inputs: int = MAX_BATCH_INPUTS
    bytes: int = MAX_BATCH_BYTES


class EmbedConfig(Protocol):
    """The embed spec's settings as its modes read them (see ``EmbedSpec`` for each)."""

    provider: EmbeddingProvider
    model: str
    dimensions: int | None
    budget: RequestBudget
    name: str
    run_id: str | None
    dag_id: str | None
    map_index: int | None
    inputs_per_call: int
    max_in_flight: int
    max_sessions: int
    systemic_after: int
    wait_for_peer_s: float
    peer_poll_s: float
    max_call_s: float | None
    max_request_tokens: int
    max_input_tokens: int
    batches: BatchApi | None
    batch_limits: BatchLimits

    @property
    def connect(self) -> Callable[[], Database]:
        """Opens a database session of the pass's own."""

    @property
    def stored_dimensions(self) -> int:
        """The dimensions its vectors and claims are stored under (0: the model's own)."""

    @property
    def request_tokens(self) -> int:
        """The most estimated tokens one sync request carries."""


def scope(spec: EmbedConfig) -> dict[str, Any]:
    """The model and dimensions (as stored) every query of an embed pass is scoped by."""
    return {"model": spec.model, "dimensions": spec.stored_dimensions}
