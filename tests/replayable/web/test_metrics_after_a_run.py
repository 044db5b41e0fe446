"""/replayable/metrics after a document_pipeline run with faults, its tasks run in process.

The metrics are read from the ledger, which the run's plan, operators and report fill as
they do in Airflow (tests/in_process.py); no Airflow run is needed to show them.
"""

from __future__ import annotations

from typing import Any

import corpus
from checks import assert_nothing_lost, ledger_metrics, scrape_metrics, subset


def test_a_scrape_after_a_run_with_faults_matches_the_ledger(
    run_in_process: Any, conn: Any, model: Any, dsn: str, tmp_path: Any, monkeypatch: Any
) -> None:
    folder = subset(tmp_path, 8)
    corpus.write_pdf(folder / "poisoned.pdf", ["This text makes the provider answer POISON-400."])
    model.set_faults(
        status_rates={"503": 0.3, "429": 0.1},
        # Retries at once: how long a retry waits is the retry tests' concern, not this one's.
        retry_after="0",
        fail_inputs_containing={"POISON-400": 400},
        seed=11,
    )
    report = run_in_process({"source": str(folder), "batch_size": 5, "embed_inputs_per_call": 4})
    assert not report["_failed"], report["_tasks"]
    assert_nothing_lost(conn)

    samples = scrape_metrics(dsn, monkeypatch)
    assert samples == ledger_metrics(conn)

    def get(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    # The faults show: errors by class, retries inside attempts, one dead letter, 9 done.
    assert get("replayable_model_calls_total", stage="embed", outcome="http_503") > 0
    assert get("replayable_model_calls_total", stage="embed", outcome="http_400") > 0
    assert get("replayable_model_call_retries_total", stage="embed") > 0
    assert get("replayable_dead_letters_created_total", stage="embed") == 1
    assert get("replayable_dead_letters_open", stage="embed") == 1
    assert get("replayable_items", stage="embed", status="done") == 8
    assert get("replayable_items", stage="embed", status="dead") == 1
    assert get("replayable_model_tokens_total", stage="embed") > 0
