"""The pipeline's non-stage steps: discover documents, plan batches, report a run.

A run's documents live in ``run_docs`` (ADR 0010): discover (or a re-run's selection) puts
them there (:mod:`~replayable.pipeline.discovery`), plan numbers the batches of those with
work left (:mod:`~replayable.pipeline.plan`), and each mapped task reads its batch by
number; :mod:`~replayable.pipeline.report` tells what the run did. Only references travel
through XCom. Which stages a DAG runs is :mod:`~replayable.pipeline.registry`'s.
"""

from __future__ import annotations

from replayable.pipeline.discovery import discover, rerun_params, select_documents
from replayable.pipeline.plan import (
    batch_doc_ids,
    plan_batches,
    record_embed_mode,
    record_run_settings,
)
from replayable.pipeline.report import (
    build_report,
    dead_share,
    format_cost,
    format_report,
    over_dead_fraction,
)

__all__ = [
    "batch_doc_ids",
    "build_report",
    "dead_share",
    "discover",
    "format_cost",
    "format_report",
    "over_dead_fraction",
    "plan_batches",
    "record_embed_mode",
    "record_run_settings",
    "rerun_params",
    "select_documents",
]
