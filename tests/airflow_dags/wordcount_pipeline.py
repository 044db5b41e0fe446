"""An Airflow DAG of a stage defined only in tests/ (wordcount_stage.py), through the factory.

The shared Airflow of the tests parses this folder as a second DAG bundle, beside dags/.
"""

from __future__ import annotations

from pathlib import Path

from wordcount_stage import WordCount

from replayable import pipeline_dag
from replayable.stages.builtin import EXTRACT

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"

# No task retries: a batch stopped by an outage fails its task at once and leaves its items
# failed under their cap, for the pipeline's sweeper (wordcount_pipeline_sweeper).
pipeline_dag("wordcount_pipeline", [EXTRACT, WordCount()], source=str(SAMPLES), retries=0)
