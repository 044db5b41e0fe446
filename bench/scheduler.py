"""B1, B4, B9: the pipeline through a real scheduler (LocalExecutor, API server, DAG processor).

- **B9** first run / physical floor. 1,000 generated PDFs, the provider answering after 100 ms;
  three first runs, each on an empty ledger, and the median of the three.
  The floor, measured in the same run, is the in-process extraction CPU time of the same
  files divided by the cores, plus the fewest requests the chunks need (distinct chunks /
  inputs per request) x latency / ``max_in_flight``: what the machine and the provider allow
  at best. Target ≤ 1.5.
- **B1** identical re-run / first run: the same trigger again, three times, the median of
  the three. Target ≤ 0.05 with 0 model calls in any of them.
- **B9.rw**, **B1.rw** the same on a corpus the project did not generate: the PDFs of the
  real-world tier (``tests/realworld.py``: LibreOffice, Ghostscript, groff, pdfTeX and the
  PDFs Debian ships), repeated to 1,000 documents (each copy a document of its own).
- **B4** one mapped task instance per document against batches of 50: 600 documents through
  the extract stage (the stage every document goes through; the other stages multiply both
  sides alike), on an empty ledger each. Target ≥ 10x.

At scale (``scale``), the same at 10,000 documents with the pipeline's defaults:

- **B9.10k** first run / physical floor, and **B1.10k** identical re-run / first run
  (target ≤ 0.02, 0 calls);
- **B12** the UI's p95 page time while the first run is going: a client signed in as the
  admin polls the overview and the dead-letter page in turn, and every answer's time from
  request to last byte counts. Target < 300 ms.

Wall time is from the REST trigger to the run's final state, as a person waiting sees it.
Where it went is read back from the run's own records (Airflow's task instances, the
ledger's claim and commit times; ``run_records.py``) and written to the details and notes:
the run's start, moments with no task running, and each stage task's queue, start-up, work
and wrap-up.
Each run is triggered once Airflow is idle (no task instance of any DAG scheduled, queued or
running), so the first one does not share the cores with the scheduled DAGs' boot-time runs.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import run_records
from harness import (
    BenchError,
    Row,
    Samples,
    Target,
    ceiling_row,
    count_rows,
    empty_ledger,
    pdf_corpus,
    realworld_corpus,
)

from devtools import devenv
from devtools.model_server import LocalModelServer
from replayable import db, sources
from replayable.invariants import check_ledger
from replayable.settings import DEFAULT_MAX_IN_FLIGHT, PipelineSettings
from replayable.stages.extract.pdf import extract_file

DOCUMENTS = 1000
PER_DOC_DOCUMENTS = 600
LATENCY_MS = 100
BATCH = 50
FIRST_RUNS = 3  # first runs of the 1,000 PDFs, each on an empty ledger; B9 is their median
RERUNS = 3  # identical re-runs after the (last) first run; B1 is their median (smoke: 1 each)
RERUN_TARGET = Target("≤ 0.05", at_most=0.05)
NO_CALLS = Target("= 0 calls", equals=0)
FLOOR_TARGET = Target("≤ 1.5", at_most=1.5)
MAPPING_TARGET = Target("≥ 10", at_least=10)
SCALE_DOCUMENTS = 10_000
SCALE_RERUN_TARGET = Target("≤ 0.02", at_most=0.02)
UI_TARGET = Target("< 300 ms", below=0.3)
UI_PAGES = ("/replayable/", "/replayable/dead-letters")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Airflow:
    """Triggers document_pipeline through the REST API and waits for the run to end."""

    def __init__(self, procs: devenv.AirflowProcesses) -> None:
        self.http = httpx.Client(
            base_url=f"{procs.url}/api/v2",
            headers={"Authorization": f"Bearer {procs.token()}"},
            timeout=30,
            trust_env=False,
        )
        deadline = time.monotonic() + 180
        while self.http.get(f"/dags/{devenv.DAG_ID}").status_code != 200:
            if time.monotonic() > deadline:
                raise BenchError("the DAG was never parsed")
            time.sleep(0.5)

    def settle(self, timeout_s: float = 300) -> None:
        """Wait until no task instance of any DAG is scheduled, queued or running, twice in a
        row a second apart. A fresh Airflow runs each scheduled DAG's latest interval at boot
        (outbox publisher, dead-letter watch, sweeper); a timed run shares the machine with
        none of that, as every later run does not. A sensor waiting to poke again is up for
        reschedule, not running, so a watch does not hold this up."""
        busy = ("scheduled", "queued", "running")
        deadline = time.monotonic() + timeout_s
        idle = 0
        while idle < 2:
            if time.monotonic() > deadline:
                raise BenchError(f"Airflow still had task instances {busy} after {timeout_s} s")
            found = self.http.get(
                "/dags/~/dagRuns/~/taskInstances", params={"state": busy, "limit": 1}
            )
            found.raise_for_status()
            idle = idle + 1 if found.json()["total_entries"] == 0 else 0
            time.sleep(1.0)

    def run(self, conf: dict[str, Any], timeout_s: float = 3600) -> tuple[float, str, str]:
        """Trigger a run with ``conf`` once Airflow is idle; return (seconds to its final
        state, state, run id)."""
        self.settle()
        started = time.perf_counter()
        created = self.http.post(
            f"/dags/{devenv.DAG_ID}/dagRuns", json={"logical_date": None, "conf": conf}
        )
        if created.status_code != 200:
            raise BenchError(f"trigger refused: {created.text}")
        run_id = created.json()["dag_run_id"]
        while (elapsed := time.perf_counter() - started) < timeout_s:
            try:
                response = self.http.get(f"/dags/{devenv.DAG_ID}/dagRuns/{run_id}")
            except httpx.TransportError:
                # An API server busy with hundreds of task instances may answer one poll
                # late; the run goes on regardless, so ask again.
                continue
            if response.status_code == 200 and response.json()["state"] in ("success", "failed"):
                return time.perf_counter() - started, response.json()["state"], run_id
            # Poll often enough to time a short run to 2 %, seldom enough that polling adds
            # no load of its own to a long one (an API server request costs CPU the run
            # shares): 1/50 of the time so far, between 20 ms and 1 s.
            time.sleep(min(max(elapsed / 50, 0.02), 1.0))
        raise BenchError(f"run {run_id} did not finish within {timeout_s} s")

    def records(self, dsn: str, run_id: str) -> dict[str, Any]:
        """Where the run's time went, from Airflow's records of it and the ledger's."""
        run = self.http.get(f"/dags/{devenv.DAG_ID}/dagRuns/{run_id}")
        run.raise_for_status()
        body = run.json()
        start = run_records._when(body.get("queued_at") or body.get("start_date"))
        end = run_records._when(body.get("end_date"))
        if start is None or end is None:
            return {}
        tasks = run_records.task_instances(self.http, devenv.DAG_ID, run_id)
        return run_records.breakdown(start, end, tasks, run_records.ledger_spans(dsn, run_id))


class _UiPoller(threading.Thread):
    """Polls the UI's pages in turn, as a person watching a run would, timing each answer."""

    def __init__(self, url: str, token: str, every_s: float) -> None:
        super().__init__(name="ui-poller", daemon=True)
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30, trust_env=False
        )
        self.every_s = every_s
        self.seconds: list[float] = []
        self.failures: list[str] = []
        self._done = threading.Event()

    def run(self) -> None:
        n = 0
        while not self._done.is_set():
            page = UI_PAGES[n % len(UI_PAGES)]
            n += 1
            started = time.perf_counter()
            try:
                response = self.http.get(page)
                response.read()
            except httpx.HTTPError as error:
                self.failures.append(f"{page}: {error!r}")
            else:
                if response.status_code == 200:
                    self.seconds.append(time.perf_counter() - started)
                else:
                    self.failures.append(f"{page}: HTTP {response.status_code}")
            self._done.wait(self.every_s)

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=60)
        self.http.close()

    def p95(self) -> float:
        if len(self.seconds) < 20:
            raise BenchError(f"only {len(self.seconds)} UI answers: {self.failures[:3]}")
        return statistics.quantiles(self.seconds, n=20)[-1]


def _extraction_cpu(folder: Path) -> tuple[float, int]:
    """In-process CPU seconds to extract every PDF of ``folder``, and the pages."""
    started = time.process_time()
    pages = 0
    for path in sorted(folder.glob("*.pdf")):
        pages += extract_file(str(path)).page_count
    return time.process_time() - started, pages


def _first_run_batches(dsn: str) -> int:
    """How many batches the first run of an empty ledger mapped (its ``runs`` row)."""
    from replayable import db

    conn = db.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT batches FROM replayable.runs ORDER BY created_at LIMIT 1")
            row = cur.fetchone()
    finally:
        conn.close()
    return int(row[0] or 0) if row else 0


def run(
    documents: int = DOCUMENTS,
    per_doc_documents: int = PER_DOC_DOCUMENTS,
    latency_ms: int = LATENCY_MS,
    batch: int | str = "auto",
    scale_documents: int = SCALE_DOCUMENTS,
    poll_every_s: float = 0.5,
    first_runs: int = FIRST_RUNS,
    reruns: int = RERUNS,
    realworld_documents: int = DOCUMENTS,
) -> tuple[list[Row], dict[str, Any]]:
    """B9, B1, B9.rw, B1.rw and B4, then B9.10k, B1.10k and B12 on the same Airflow;
    ``batch`` is the first run's batch_size, by default the pipeline's own ("auto"); B4
    always compares one per document with 50; the runs at scale use the defaults, with one
    first run. A size of 0 leaves its figures out (``per_doc_documents``: B4,
    ``scale_documents``: the figures at scale, ``realworld_documents``: B9.rw, B1.rw)."""
    corpus = pdf_corpus(documents)
    big = pdf_corpus(scale_documents, seed=13) if scale_documents else None
    realworld, realworld_made = (
        realworld_corpus(realworld_documents) if realworld_documents else (None, [])
    )
    if realworld is not None and not any(realworld.glob("*.pdf")):
        realworld = None  # no producer on this machine: the details say so
    cores = os.cpu_count() or 1
    with (
        tempfile.TemporaryDirectory(prefix="replayable-bench-") as tmp,
        LocalModelServer(dim=64) as model,
    ):
        state = Path(tmp)
        services = devenv.start(state, model_url=model.base_url)
        dsn = services.replayable_dsn
        try:
            env = devenv.airflow_env(services, state, api_port=_free_port())
            env[sources.ROOTS_ENV] = str(corpus.parent)
            with devenv.AirflowProcesses(env, state / "logs") as procs:
                airflow = _Airflow(procs)
                model.set_faults(latency_ms=latency_ms)
                small = _Runs.of(
                    airflow,
                    model,
                    dsn,
                    {"source": str(corpus), "batch_size": batch},
                    first_runs=first_runs,
                    reruns=reruns,
                )

                # The real-world PDFs, repeated, with the defaults, on an empty ledger.
                real = None
                if realworld is not None:
                    assert str(realworld.parent) == env[sources.ROOTS_ENV]
                    empty_ledger(dsn)
                    real = _Runs.of(
                        airflow,
                        model,
                        dsn,
                        {"source": str(realworld)},
                        first_runs=first_runs,
                        reruns=reruns,
                    )

                # B4 on an empty ledger each time: one task instance per document, then 50.
                mapped: dict[int, float] = {}
                if per_doc_documents:
                    subset = pdf_corpus(per_doc_documents, seed=12)
                    assert str(subset.parent) == env[sources.ROOTS_ENV]
                for size in (1, BATCH) if per_doc_documents else ():
                    empty_ledger(dsn)
                    seconds, end, _ = airflow.run(
                        {"source": str(subset), "batch_size": size, "stages": ["extract"]}
                    )
                    if end != "success":
                        raise BenchError(f"the batch_size={size} run ended {end}")
                    mapped[size] = seconds

                # At scale, on an empty ledger, with the UI polled during the first run.
                at_scale = poller = None
                if big is not None:
                    empty_ledger(dsn)
                    poller = _UiPoller(procs.url, procs.token(), poll_every_s)
                    poller.start()
                    try:
                        at_scale = _Runs.of(
                            airflow, model, dsn, {"source": str(big)}, reruns=reruns
                        )
                    finally:
                        poller.stop()
        finally:
            devenv.stop(state)

    rows, floor = _run_rows(small, corpus, "", f"{documents} docs", latency_ms, cores, RERUN_TARGET)
    details: dict[str, Any] = {
        "documents": documents,
        **small.details(),
        **floor,
        "batch_size": batch,
        "notes": [
            f"{documents} PDFs, {floor['pages']} pages, {small.chunks} distinct chunks; "
            f"first runs {_seconds(small.firsts)} ({small.first_calls} requests) in "
            f"{small.batches} batches (batch_size {batch!r}), re-runs {_seconds(small.agains)} "
            f"({small.again_calls} requests)",
            "where the last first run's time went:",
            *run_records.describe(small.first_records),
            "where the last re-run's time went:",
            *run_records.describe(small.again_records),
        ],
    }
    if real is not None and realworld is not None:
        tag = f"{realworld_documents} real-world docs"
        real_rows, real_floor = _run_rows(
            real, realworld, ".rw", tag, latency_ms, cores, RERUN_TARGET
        )
        rows += real_rows
        details["realworld"] = {
            "documents": realworld_documents,
            "made_of": realworld_made,
            **real.details(),
            **real_floor,
        }
        details["notes"] += [
            f"{tag} ({'; '.join(realworld_made)}), {real_floor['pages']} pages, {real.chunks} "
            f"distinct chunks: first runs {_seconds(real.firsts)} ({real.first_calls} "
            f"requests) in {real.batches} batches, re-runs {_seconds(real.agains)} "
            f"({real.again_calls} requests); where the last first run's time went:",
            *run_records.describe(real.first_records),
        ]
    elif realworld_documents:
        details["notes"].append(
            f"B9.rw, B1.rw not measured: no real-world producer wrote a PDF on this machine "
            f"({'; '.join(realworld_made)}; tests/install-realworld-tools.sh installs them)"
        )
    if mapped:
        rows.append(
            Row(
                "B4",
                f"one task instance per document / batches of {BATCH} ({per_doc_documents} docs)",
                f"batches of {BATCH}",
                Samples((mapped[BATCH],)),
                "one per document",
                Samples((mapped[1],)),
                MAPPING_TARGET,
                notes=["ratio = how many times faster batches are (higher is better)"],
            )
        )
        details["per_document_s"] = round(mapped[1], 2)
        details["batched_s"] = round(mapped[BATCH], 2)
        details["notes"].append(
            f"extract stage, {per_doc_documents} PDFs: {mapped[1]:.1f} s one task instance "
            f"per document, {mapped[BATCH]:.1f} s in batches of {BATCH}"
        )
    if at_scale is not None and big is not None and poller is not None:
        scale_rows, scale_floor = _run_rows(
            at_scale,
            big,
            ".10k",
            f"{scale_documents:,} docs",
            latency_ms,
            cores,
            SCALE_RERUN_TARGET,
        )
        rows += [*scale_rows, _ui_row(poller, f"{scale_documents:,} docs")]
        details["notes"] += [
            f"at scale, {scale_documents} PDFs: first run {at_scale.first:.1f} s "
            f"({at_scale.first_calls} requests) in {at_scale.batches} batches, re-runs "
            f"{_seconds(at_scale.agains)} ({at_scale.again_calls} requests); UI p95 "
            f"{poller.p95() * 1000:.0f} ms over {len(poller.seconds)} answers",
            "where the first run at scale's time went:",
            *run_records.describe(at_scale.first_records),
        ]
        details["scale"] = {
            "documents": scale_documents,
            **at_scale.details(),
            **scale_floor,
            "ui_answers": len(poller.seconds),
            "ui_p95_ms": round(poller.p95() * 1000, 1),
            "ui_failures": poller.failures[:10],
        }
    return rows, details


def _check_ledger(dsn: str) -> None:
    """A figure counts only over a ledger that keeps its invariants (ADR 0150): after the
    runs, nothing in flight, ``replayable check --quiescent`` must find no violation."""
    with contextlib.closing(db.connect(dsn)) as conn:
        found = check_ledger(conn, quiescent=True, limit=5)
    if found:
        raise BenchError(f"the ledger the runs left breaks its invariants: {found}")


def _seconds(values: tuple[float, ...]) -> str:
    return ", ".join(f"{value:.2f}" for value in values) + " s"


@dataclass(frozen=True)
class _Runs:
    """First runs (each on an empty ledger) and identical re-runs of one folder, with what
    the provider saw; each figure is the median of its runs."""

    firsts: tuple[float, ...]
    first_calls: int  # in the last first run
    agains: tuple[float, ...]
    again_calls: int  # over every re-run
    batches: int
    chunks: int
    first_records: dict[str, Any]  # where the last first run's time went (run_records)
    again_records: dict[str, Any]  # the same for the last re-run

    @property
    def first(self) -> float:
        return statistics.median(self.firsts)

    @property
    def again(self) -> float:
        """The median re-run: a re-run is a few task instances, whose timing varies by
        scheduler loops (0.2 s each) more than a long first run does."""
        return statistics.median(self.agains)

    @classmethod
    def of(
        cls,
        airflow: _Airflow,
        model: LocalModelServer,
        dsn: str,
        conf: dict[str, Any],
        *,
        first_runs: int = 1,
        reruns: int = RERUNS,
    ) -> _Runs:
        firsts: list[float] = []
        for n in range(first_runs):
            if n:
                empty_ledger(dsn)
            model.reset_stats()
            first, first_state, run_id = airflow.run(conf)
            if first_state != "success":
                raise BenchError(f"a first run of {conf} ended {first_state}")
            firsts.append(first)
            # Read before the next first run empties the ledger of its claims.
            first_records = airflow.records(dsn, run_id)
        first_calls = model.stats()["requests"]
        model.reset_stats()
        agains: list[float] = []
        for _ in range(reruns):
            again, again_state, again_id = airflow.run(conf)
            if again_state != "success":
                raise BenchError(f"a re-run of {conf} ended {again_state}")
            agains.append(again)
            again_records = airflow.records(dsn, again_id)
        _check_ledger(dsn)
        return cls(
            tuple(firsts),
            first_calls,
            tuple(agains),
            model.stats()["requests"],
            _first_run_batches(dsn),
            count_rows(dsn, "chunks"),
            first_records,
            again_records if agains else {},
        )

    def details(self) -> dict[str, Any]:
        return {
            "chunks": self.chunks,
            "requests_first_run": self.first_calls,
            "first_run_s": round(self.first, 2),
            "first_runs_s": [round(first, 2) for first in self.firsts],
            "rerun_s": round(self.again, 2),
            "reruns_s": [round(again, 2) for again in self.agains],
            "batches": self.batches,
            "first_run_records": self.first_records,
            "rerun_records": self.again_records,
        }


def _run_rows(
    runs: _Runs,
    folder: Path,
    suffix: str,
    tag: str,
    latency_ms: int,
    cores: int,
    rerun_target: Target,
) -> tuple[list[Row], dict[str, Any]]:
    """B9, B1 and B1.calls (``suffix``: ``""`` or ``".10k"``), and the floor's terms."""
    cpu, pages = _extraction_cpu(folder)
    requests = math.ceil(runs.chunks / PipelineSettings().embed_inputs_per_call)
    floor = cpu / cores + requests * (latency_ms / 1000) / DEFAULT_MAX_IN_FLIGHT
    rows = [
        Row(
            f"B9{suffix}",
            f"first run / physical floor ({tag}, {latency_ms} ms/request, {cores} cores)",
            "floor",
            Samples((floor,)),
            "first run",
            Samples(runs.firsts),
            FLOOR_TARGET,
            notes=[
                f"floor = {cpu:.1f} CPU-s extraction / {cores} cores + {requests} requests x "
                f"{latency_ms} ms / {DEFAULT_MAX_IN_FLIGHT} in flight = {floor:.1f} s"
            ],
        ),
        Row(
            f"B1{suffix}",
            f"identical re-run / first run ({tag}, real scheduler)",
            "first run",
            Samples((runs.first,)),
            "identical re-run",
            Samples(runs.agains),
            rerun_target,
        ),
        Row(
            f"B1{suffix}.calls",
            f"model calls on the identical re-run ({tag})",
            "first run",
            Samples((float(runs.first_calls),), unit="calls"),
            "re-run",
            Samples((float(runs.again_calls),), unit="calls"),
            NO_CALLS,
            target_on="measured",
        ),
    ]
    terms = {
        "pages": pages,
        "requests_minimal": requests,
        "extraction_cpu_s": round(cpu, 2),
        "floor_s": round(floor, 2),
    }
    return rows, terms


def _ui_row(poller: _UiPoller, tag: str) -> Row:
    """B12: the UI's p95 page time while the first run at scale went."""
    p95 = poller.p95()
    return ceiling_row(
        "B12",
        f"UI p95 page time during the first run ({tag})",
        f"p95 of {len(poller.seconds)} answers (overview, dead letters)",
        p95,
        UI_TARGET,
        notes=[
            f"median {statistics.median(poller.seconds) * 1000:.0f} ms, slowest "
            f"{max(poller.seconds) * 1000:.0f} ms, {len(poller.failures)} failed"
        ],
    )
