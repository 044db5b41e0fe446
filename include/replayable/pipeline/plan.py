"""A run's plan: its settings and embed mode kept with it, and the numbered batches of the
documents with work left, which each mapped task reads by number.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from replayable import config
from replayable.db import Connection, execute, fetch_all
from replayable.pipeline.registry import pipeline_of
from replayable.settings import AUTO, BOUNDS, PipelineSettings
from replayable.stage import Pipeline

log = logging.getLogger(__name__)


def record_embed_mode(
    conn: Connection, settings: PipelineSettings, *, dag_id: str, run_id: str
) -> None:
    """Record the run's embed mode with the run, for a sweep to re-run what it leaves in the
    same mode (ADR 0130). The caller commits."""
    execute(
        conn,
        "plan/run_embed_mode",
        {"dag_id": dag_id, "run_id": run_id, "embed_mode": settings.embed_mode},
    )


# batch_size "auto" (ADR 0104): this many batches per parallel slot, each of at least
# AUTO_MIN_BATCH documents (a small run is one batch) and at most the largest batch_size.
BATCHES_PER_SLOT = 2
AUTO_MIN_BATCH = 25


def plan_batches(
    conn: Connection,
    settings: PipelineSettings,
    *,
    dag_id: str,
    run_id: str,
    spec_hashes: Mapping[str, str],
    stages: Pipeline | None = None,
    max_map_length: int = config.DEFAULT_MAX_MAP_LENGTH,
    slots: int = 1,
    revived_by: str | None = None,
) -> list[dict[str, Any]]:
    """Number the batches of the run's documents that have work left; return their refs.

    A document has work when, walking some chain of inputs of ``stages`` (the pipeline of
    ``dag_id`` unless given; :meth:`Pipeline.paths`) in order, the
    first stage not done under its current spec is one this run executes and is not dead
    there (unless the run revives dead items of that stage). One query decides it for all
    stages at once; an identical re-run of a finished corpus therefore maps no batch at all.

    Batches hold ``batch_size`` documents each; under ``"auto"`` the size is chosen from the
    number of documents with work: ``BATCHES_PER_SLOT`` batches for each of ``slots``, within
    ``AUTO_MIN_BATCH`` and the largest ``batch_size``. Either way it grows when needed so that
    no more than ``max_map_length`` batches result.

    A run that revives dead items closes, as redriven by ``revived_by``, the open letters
    of its first stage whose documents are done there under the current spec already: no
    claim will take those items, and their work is done (ADR 0083).
    """
    stages = stages or pipeline_of(dag_id)
    effective = stages.effective_stages(settings)
    first = settings.first_stage
    revive = settings.revives_dead or bool(settings.redrive)
    closes = revive and first is not None and first in effective
    # Every chain of inputs, flattened: each stage's path number, input first (ADR 0107).
    cells = [(n, stage) for n, path in enumerate(stages.paths()) for stage in path]
    params = {
        "dag_id": dag_id,
        "run_id": run_id,
        "paths": [n for n, _ in cells],
        "stages": [stage for _, stage in cells],
        "spec_hashes": [spec_hashes[stage] for _, stage in cells],
        "effective": [stage in effective for _, stage in cells],
        "revive": [revive and stage == first for _, stage in cells],
        "batch_size": None if settings.batch_size == AUTO else settings.batch_size,
        "auto_batches": max(1, slots) * BATCHES_PER_SLOT,
        "auto_min": AUTO_MIN_BATCH,
        "auto_max": int(BOUNDS["batch_size"][1]),
        "max_map_length": max_map_length,
        "close_stage": first if closes else None,
        "close_spec_hash": spec_hashes[first] if closes and first else None,
        "closed_by": revived_by or "redrive",
    }
    rows = fetch_all(conn, "plan/plan_batches", params)
    conn.commit()
    batches = []
    for row in rows:
        first_doc, size = int(row["first_position"]), int(row["size"])
        label = f"batch {row['batch']}: docs {first_doc}-{first_doc + size - 1}"
        batches.append({"index": int(row["batch"]), "label": label, "size": size})
    return batches


def batch_doc_ids(conn: Connection, *, dag_id: str, run_id: str, batch: int) -> list[str]:
    """The documents of one batch of a run, in order."""
    rows = fetch_all(
        conn, "ledger/batch_doc_ids", {"dag_id": dag_id, "run_id": run_id, "batch": batch}
    )
    conn.commit()
    return [row["doc_id"] for row in rows]


# Params that select a run's documents rather than shape its work: not kept for the sweep.
_SELECTION_PARAMS = ("rerun", "redrive", "source", "stages")


def record_run_settings(
    conn: Connection, *, dag_id: str, run_id: str, params: Mapping[str, Any]
) -> None:
    """Keep the params a run was planned with, less its selection, in its ``runs`` row: the
    sweep re-runs an item this run left failed under them (ADR 0135)."""
    kept = {k: v for k, v in params.items() if k not in _SELECTION_PARAMS}
    execute(
        conn,
        "plan/record_run_settings",
        {
            "dag_id": dag_id,
            "run_id": run_id,
            "settings": json.dumps(kept, sort_keys=True, default=str),
        },
    )
