"""Discover PDFs, plan the batches with work left, extract → chunk → embed (and, when a
run's ``stages`` name it, extract → summarize); report; publish.

The Airflow DAG is the shipped stages through ``pipeline_dag``, as a pipeline of your own
stages would be (README, "Write your own stage"). Its hourly sweeper, which re-runs the
items its runs left failed under their attempt cap, is ``replayable_sweeper``.
"""

from __future__ import annotations

from pathlib import Path

from replayable import pipeline_dag
from replayable.stages.builtin import BUILTIN
from replayable.vocabulary import DEFAULT_STAGES, PIPELINE_DAG_ID, SWEEPER_DAG_ID

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"

pipeline_dag(
    PIPELINE_DAG_ID,
    BUILTIN,
    source=str(SAMPLES),
    default_stages=DEFAULT_STAGES,
    sweeper=SWEEPER_DAG_ID,
    doc_md=__doc__,
)
