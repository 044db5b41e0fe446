"""Replayable: idempotent, replayable AI document pipelines on Apache Airflow 3.3.

What DAG files use is exported here. The exports load lazily, so that processes which only
need the library (the local model server, guarded workers, the terminal CLI) do not pay for
importing Airflow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from replayable.airflow.dag_factory import pipeline_dag
    from replayable.airflow.operators import IdempotentStageOperator
    from replayable.airflow.params import pipeline_params
    from replayable.airflow.publisher import (
        DOCUMENTS_READY,
        DOCUMENTS_RETRACTED,
        PublishEventsOperator,
    )
    from replayable.airflow.sensors import DeadLetterGrowthSensor
    from replayable.settings import TASK_TIMEOUTS, PipelineSettings
    from replayable.stage import BuildContext, Models, Pipeline, Stage
    from replayable.stages.artifact import ArtifactStage, Document

__all__ = [
    "DOCUMENTS_READY",
    "DOCUMENTS_RETRACTED",
    "TASK_TIMEOUTS",
    "ArtifactStage",
    "BuildContext",
    "DeadLetterGrowthSensor",
    "Document",
    "IdempotentStageOperator",
    "Models",
    "Pipeline",
    "PipelineSettings",
    "PublishEventsOperator",
    "Stage",
    "pipeline_dag",
    "pipeline_params",
]

_HOMES = {
    "ArtifactStage": "replayable.stages.artifact",
    "BuildContext": "replayable.stage",
    "Document": "replayable.stages.artifact",
    "Models": "replayable.models.choice",
    "Pipeline": "replayable.stage",
    "Stage": "replayable.stage",
    "pipeline_dag": "replayable.airflow.dag_factory",
    "DOCUMENTS_READY": "replayable.airflow.publisher",
    "DOCUMENTS_RETRACTED": "replayable.airflow.publisher",
    "DeadLetterGrowthSensor": "replayable.airflow.sensors",
    "IdempotentStageOperator": "replayable.airflow.operators",
    "PipelineSettings": "replayable.settings",
    "TASK_TIMEOUTS": "replayable.settings",
    "PublishEventsOperator": "replayable.airflow.publisher",
    "pipeline_params": "replayable.airflow.params",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'replayable' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
