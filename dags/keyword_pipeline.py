"""Extract, then the keywords of each document: a pipeline with a stage of your own.

The Airflow DAG has document_pipeline's shape (plan, a mapped group per batch, report,
publish) and every guarantee of its stages; ``Keywords`` is defined in
custom_stages/keywords.py, outside the package.
"""

from __future__ import annotations

from pathlib import Path

from custom_stages.keywords import Keywords
from replayable import pipeline_dag
from replayable.stages.builtin import EXTRACT

pipeline_dag(
    "keyword_pipeline",
    [EXTRACT, Keywords(top=8)],
    source=str(Path(__file__).resolve().parents[1] / "data" / "samples"),
    doc_md=__doc__,
)
