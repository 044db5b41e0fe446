"""document_pipeline on the Celery cluster of `make cluster`: two workers, one killed mid-batch.

The cluster is what ``make cluster`` starts (``devenv.Cluster``): Redis, an API server, a
scheduler, a DAG processor, a triggerer and two Celery workers, each in its own process
group, with the settings docker-compose.yaml reads (airflow.env). It gets a metadata
database and an Airflow home of its own, so the runs of other tests are not its business.

Three runs over the same 200 generated documents, each printing what the provider saw:

1. a worker is SIGKILLed while it embeds; Airflow's own retries finish the run on the other
   worker (and on the first, restarted): nothing lost, no chunk charged twice;
2. the provider answers 429 beyond C requests at once: the pipeline never sends more than C,
   whatever the workers and mapped tasks, and keeps C busy;
3. with max_rps R, no window of the run sees more than R a second (plus the bucket's burst).
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import corpus
from checks import ProviderSampler, assert_nothing_lost, rows, scalar
from devtools import devenv
from replayable import db, sources
from replayable.pipeline import format_report

pytestmark = [pytest.mark.cluster, pytest.mark.e2e]

DOCS = 200
C = 4  # the provider's concurrency limit, and the pipeline's max_in_flight
LATENCY_S = 0.25  # the provider's answer time in the budget run, as a hosted API's
RATE = 20.0  # max_rps of the third run


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cluster-docs")
    corpus.write_sample_corpus(folder, n=DOCS)
    return folder


@pytest.fixture(scope="module")
def cluster(
    services: devenv.Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[devenv.Cluster]:
    # A metadata database of its own: the other tests' runs must not be scheduled here.
    conn = db.connect(services.replayable_dsn, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("DROP DATABASE IF EXISTS airflow_cluster")
            cur.execute("CREATE DATABASE airflow_cluster")
    finally:
        conn.close()
    base, _, query = services.airflow_db_url.partition("?")
    own = replace(services, airflow_db_url=f"{base.rsplit('/', 1)[0]}/airflow_cluster?{query}")
    state = tmp_path_factory.mktemp("cluster")
    extra_env = {
        sources.ROOTS_ENV: str(tmp_path_factory.getbasetemp()),
        # The killed worker's task is found without a heartbeat in 20 s, not airflow.env's
        # 60: the retry and what it proves are the same, sooner.
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
    }
    with devenv.Cluster(own, state, extra_env=extra_env) as running:
        yield running


@pytest.fixture(scope="module")
def api(cluster: devenv.Cluster) -> Iterator[devenv.AirflowApi]:
    client = devenv.AirflowApi(cluster.url, cluster.airflow.token())
    try:
        client.wait_for_dag()
        # The scheduled dead-letter watch would only take worker slots from the pipeline.
        client.http.patch("/dags/dead_letter_watch", json={"is_paused": True})
        yield client
    finally:
        client.close()


@pytest.fixture
def ledger(dsn: str) -> Iterator[Any]:
    """The replayable database as the previous run left it (``conn`` would empty it)."""
    connection = db.connect(dsn)
    yield connection
    connection.close()


def reconciliation(conn: Any) -> dict[str, dict[str, int]]:
    """Per stage: items in, and how many ended done, failed or dead (and anything else)."""
    found: dict[str, dict[str, int]] = {}
    for stage, status, n in rows(
        conn, "SELECT stage, status, count(*) FROM replayable.stage_runs GROUP BY 1, 2"
    ):
        entry = found.setdefault(stage, {"in": 0, "done": 0, "failed": 0, "dead": 0})
        entry["in"] += n
        entry[status] = entry.get(status, 0) + n
    return found


def show(title: str, conn: Any, run_id: str, stats: dict[str, Any]) -> None:
    report = _report(conn, run_id)
    print(f"\n=== {title}: {run_id}")
    if report:
        print(format_report(report))
    for stage, entry in reconciliation(conn).items():
        print(
            f"reconciliation {stage}: in {entry['in']} = done {entry['done']} + failed "
            f"{entry['failed']} + dead {entry['dead']}"
        )
    counts = stats["input_success_counts"].values()
    print(
        f"provider: {stats['requests']} requests, {stats['charged']} charged, "
        f"{stats['deduplicated']} deduplicated, {stats['rejected_concurrency']} refused over "
        f"the limit; peak in flight {stats['peak_in_flight']} (C = {C}); inputs charged more "
        f"than once: {sum(1 for n in counts if n > 1)}"
    )


def _report(conn: Any, run_id: str) -> dict[str, Any] | None:
    found = rows(conn, "SELECT report FROM replayable.run_reports WHERE run_id = %s", run_id)
    return found[0][0] if found else None


def wait_for_embed_on(api: devenv.AirflowApi, run_id: str, worker: str) -> dict[str, Any]:
    """Once both workers have run batch tasks, a batch.embed running on ``worker``."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        instances = api.task_instances(run_id)
        ran = devenv.tasks_by_worker(instances)
        for ti in instances:
            on_it = str(ti.get("hostname") or "").startswith(f"{worker}@")
            embedding = ti["task_id"] == "batch.embed" and ti["state"] == "running"
            if embedding and on_it and len(ran) == 2:
                return ti
        if api.state(run_id) in ("success", "failed"):
            break
        time.sleep(0.2)
    raise AssertionError(f"no batch.embed ran on {worker} while both workers were busy")


def test_a_worker_killed_mid_batch_costs_a_retry_not_a_document(
    cluster, api, documents, conn, model
):
    """SIGKILL a worker while it embeds: the run completes, nothing lost or charged twice."""
    model.set_faults(latency_ms=100)
    run_id = api.trigger(
        {
            "source": str(documents),
            "batch_size": 25,
            "max_in_flight": C,
            "embed_inputs_per_call": 8,
            # A dead worker's leases expire soon, so its retry need not wait long for them.
            "lease_s": 20,
            "item_timeout_s": 10,
        }
    )
    victim = wait_for_embed_on(api, run_id, "worker-1")
    cluster.airflow.kill("celery worker#1", signal.SIGKILL)
    killed = (victim["task_id"], victim["map_index"])
    print(f"\nSIGKILLed worker-1 while it ran {killed[0]}[{killed[1]}]")
    time.sleep(5)
    cluster.airflow.start("celery worker", label="celery worker#1")  # as a supervisor would

    assert api.wait(run_id, timeout_s=900) == "success"
    instances = api.task_instances(run_id)
    tries = api.tries(run_id, *killed)
    by_worker = devenv.tasks_by_worker(instances)
    print(f"batch tasks per worker (last try): {by_worker}")
    print(
        "tries of the killed task: "
        + json.dumps([(t["try_number"], t["state"], t["hostname"]) for t in tries])
    )
    # Both workers ran batches, and the killed task was retried by Airflow to success.
    assert set(by_worker) == {"worker-1", "worker-2"}
    assert len(tries) >= 2 and tries[0]["hostname"].startswith("worker-1@")
    assert tries[-1]["state"] == "success"

    stats = model.stats()
    show("run 1, a worker killed mid-batch", conn, run_id, stats)
    assert_nothing_lost(conn)
    assert scalar(conn, "SELECT count(*) FROM replayable.documents") == DOCS
    assert rows(conn, "SELECT count(*) FROM replayable.stage_runs WHERE status <> 'done'") == [(0,)]
    # No chunk charged twice: every input the provider embedded, it charged once.
    assert set(stats["input_success_counts"].values()) == {1}
    assert stats["inputs_embedded"] == scalar(conn, "SELECT count(*) FROM replayable.chunks")


def test_the_provider_never_sees_more_than_c_requests_from_two_workers(
    api, documents, ledger, model
):
    """A provider refusing beyond C at once: no refusal, at most C in flight, C kept busy.

    The documents are extracted and chunked by the first run; a new model makes every batch
    embed all its chunks again, every batch's mapped embed task at once on two workers.
    """
    model.set_faults(latency_ms=int(LATENCY_S * 1000), max_concurrency=C)
    model.reset_stats()
    # Four batches: one embed task per worker slot (two workers, two slots each), all at once.
    conf = {
        "source": str(documents),
        "batch_size": 50,
        "model": "budget-check",
        "max_in_flight": C,
        "embed_inputs_per_call": 16,
    }
    with ProviderSampler(model, every_s=0.1) as sampler:
        run_id = api.trigger(conf)
        assert api.wait(run_id, timeout_s=900) == "success"
    stats = model.stats()
    show("run 2, a provider limited to C at once", ledger, run_id, stats)
    requests, span = sampler.busy_span()
    ideal = C / LATENCY_S
    print(
        f"throughput: {requests} requests in {span:.1f} s = {requests / span:.1f}/s; "
        f"C / latency = {ideal:.0f}/s; ratio {requests / span / ideal:.2f} (target >= 0.8)"
    )
    assert stats["rejected_concurrency"] == 0
    assert stats["peak_in_flight"] == C
    assert set(stats["input_success_counts"].values()) == {1}
    assert_nothing_lost(ledger, one_version=False)


def test_the_provider_never_sees_more_than_max_rps(api, documents, ledger, model):
    """With max_rps R, no stretch of the run brings the provider more than R a second."""
    model.set_faults(latency_ms=20)
    model.reset_stats()
    conf = {
        "source": str(documents),
        "batch_size": 25,
        "model": "rate-check",
        "max_in_flight": C,
        "max_rps": RATE,
    }
    with ProviderSampler(model, every_s=0.05) as sampler:
        run_id = api.trigger(conf)
        assert api.wait(run_id, timeout_s=900) == "success"
    stats = model.stats()
    show("run 3, max_rps", ledger, run_id, stats)
    requests, span = sampler.busy_span()
    excess, window = sampler.worst_window(RATE)
    print(
        f"rate: {requests} requests in {span:.1f} s = {requests / span:.1f}/s (max_rps {RATE:g}); "
        f"worst window {window:.1f} s: {excess} request(s) above the rate"
    )
    assert requests >= 4 * RATE  # long enough for the rate to bind
    assert excess <= 2  # the bucket's burst of one, plus one for sampling
    assert_nothing_lost(ledger, one_version=False)
