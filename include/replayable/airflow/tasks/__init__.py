"""Task callables of the pipeline that are not stages: plan (with discover), report, sweep.

Each returns a small reference or a count, never a list of documents (ADR 0010): the run's
documents and batches live in the ``run_docs`` table.
"""

from __future__ import annotations

from replayable.airflow.tasks.planning import plan, plan_task
from replayable.airflow.tasks.reporting import report
from replayable.airflow.tasks.sweeping import sweep

__all__ = ["plan", "plan_task", "report", "sweep"]
