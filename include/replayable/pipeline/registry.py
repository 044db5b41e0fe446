"""Which pipeline a DAG runs: the registry the DAG factory fills when a DAG file is parsed.

A task finds its stages again by its DAG id, in the scheduler's processes and the worker's.
A DAG id nobody registered runs the shipped document pipeline's stages.
"""

from __future__ import annotations

from replayable.stage import Pipeline
from replayable.stages.builtin import document_pipeline

__all__ = ["pipeline_of", "register"]

_PIPELINES: dict[str, Pipeline] = {}


def register(pipeline: Pipeline) -> Pipeline:
    """Make ``pipeline`` what :func:`pipeline_of` answers for its DAG id (the DAG factory
    calls this when a DAG file is parsed, in the scheduler's processes and the worker's)."""
    _PIPELINES[pipeline.dag_id] = pipeline
    return pipeline


def pipeline_of(dag_id: str) -> Pipeline:
    """The pipeline registered for ``dag_id``; the document pipeline's stages otherwise."""
    found = _PIPELINES.get(dag_id)
    if found is not None:
        return found
    return document_pipeline(dag_id)
