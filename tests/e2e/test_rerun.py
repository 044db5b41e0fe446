"""Operating the pipeline through Airflow: a code-version bump as a deploy makes it.

Partial re-runs and dead-letter redrive run in process
(tests/replayable/test_pipeline_in_process.py).
"""

from __future__ import annotations

import os

import pytest

from checks import assert_nothing_lost, rows, scalar, subset

pytestmark = pytest.mark.e2e


def test_a_code_version_bump_reextracts_and_unchanged_text_costs_no_embedding(
    run_dag, conn, model, tmp_path
):
    folder = subset(tmp_path, 6)
    first = run_dag({"source": str(folder), "batch_size": 3})
    assert first["_returncode"] == 0, first["_log"]
    embeddings = scalar(conn, "SELECT count(*) FROM replayable.embeddings")

    # Deploying an extractor with a new version, without editing the source under test.
    bump = tmp_path / "bump"
    bump.mkdir()
    (bump / "sitecustomize.py").write_text(
        "import replayable.stages.extract as extract\nextract.VERSION = '1.1'\n"
    )
    pythonpath = os.pathsep.join([str(bump), run_dag.env["PYTHONPATH"]])
    env = {"PYTHONPATH": pythonpath}

    # A re-run selected by code version finds the documents last extracted before 1.1.
    rerun = {"rerun": {"stage": "extract", "code_version_lt": "1.1"}, "batch_size": 3}
    second = run_dag(rerun, env=env)
    assert second["_returncode"] == 0, second["_log"]
    assert second["documents"] == 6
    versions = dict(
        rows(
            conn,
            "SELECT extractor_version, count(*) FROM replayable.extractions"
            " GROUP BY extractor_version",
        )
    )
    assert versions == {"1.0": 6, "1.1": 6}
    assert second["model_calls"]["calls"] == 0
    assert scalar(conn, "SELECT count(*) FROM replayable.embeddings") == embeddings
    assert all(second["stages"][s]["done"] == 6 for s in ("extract", "chunk", "embed"))

    # Now nothing is older than 1.1, and a plain run finds every document done.
    assert run_dag(rerun, env=env)["documents"] == 0
    third = run_dag({"source": str(folder), "batch_size": 3}, env=env)
    assert (third["documents"], third["to_do"], third["batches"]) == (6, 0, 0)
    assert all(third["stages"][s]["done"] == 6 for s in ("extract", "chunk", "embed"))
    assert_nothing_lost(conn, one_version=False)
