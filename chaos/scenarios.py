"""The chaos scenarios: each puts one production fault into real runs, then reconciles them.

A scenario writes its corpus (``documents`` files, 5 % of them poison), empties the
replayable database, sets the provider's faults, triggers ``document_pipeline`` through the
REST API, injects its fault while the run is under way, and waits for the run to end. A run
that ends failed gets one clear of what failed (``clearTaskInstances``, only failed), as an
operator would do, and must then succeed. The scenario ends with a :mod:`chaos.reconcile`
table, plus the facts that show the fault really happened (which processes were killed,
which tries overlapped, how long Postgres was down, …) and checks on them.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import psutil

from chaos import documents
from chaos.documents import PROVIDER_POISON_MARKER, Corpus
from chaos.env import (
    AIRFLOW_SETTINGS,
    DAG,
    MODEL_MAX_IN_FLIGHT,
    MODEL_TIMEOUT_S,
    WEBHOOK,
    WEBHOOK_EXTRA,
    ChaosEnv,
)
from chaos.reconcile import Reconciliation, format_table, reconcile

T = TypeVar("T")

BASE_FAULTS: dict[str, Any] = {"fail_inputs_containing": {PROVIDER_POISON_MARKER: 400}}
# A slow provider keeps embed tasks running long enough to be hit mid-work.
SLOW_PROVIDER_MS = 1000
POSTGRES_DOWN_S = 10
RETRY_AFTER_S = 65  # longer than one call may wait (CallRetry.max_total_s = 60)
STORM_S = 10  # the storm lasts this long after its first refusal
HANG_S = 30


@dataclass
class Part:
    """One reconciliation of a scenario (scenario f has one per de-duplication setting)."""

    label: str
    reconciliation: Reconciliation


@dataclass
class ScenarioResult:
    key: str
    title: str
    seconds: float = 0.0
    parts: list[Part] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)  # the scenario's own failed checks

    @property
    def problems(self) -> list[str]:
        found = list(self.checks)
        for part in self.parts:
            found += [f"{part.label}: {p}" for p in part.reconciliation.problems]
        return found

    @property
    def passed(self) -> bool:
        return bool(self.parts) and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "seconds": round(self.seconds, 1),
            "passed": self.passed,
            "problems": self.problems,
            "facts": self.facts,
            "reconciliations": [
                {"label": p.label, **p.reconciliation.to_json()} for p in self.parts
            ],
        }

    def describe(self) -> str:
        lines = [f"== ({self.key}) {self.title}: {'PASS' if self.passed else 'FAIL'}"]
        lines += [f"   {k}: {v}" for k, v in self.facts.items()]
        for part in self.parts:
            lines.append(f"-- {part.label}")
            lines.append(format_table(part.reconciliation))
        lines += [f"!! {p}" for p in self.problems]
        lines.append(f"   took {self.seconds:.0f} s")
        return "\n".join(lines)


@dataclass(frozen=True)
class Size:
    """How big each scenario's runs are; the batch shape follows from the document count."""

    documents: int = 300
    poison_share: float = 0.05

    @property
    def batch_size(self) -> int:
        return max(10, math.ceil(self.documents / 6))

    @property
    def inputs_per_call(self) -> int:
        return max(2, self.batch_size // 6)


class Context:
    """What a scenario works with: the environment, the run size and a log."""

    def __init__(self, env: ChaosEnv, size: Size, log: Callable[[str], None] = print) -> None:
        self.env = env
        self.size = size
        self.log = log
        self.dedupe = False

    # -- set-up --------------------------------------------------------------------------

    def corpus(self, name: str) -> Corpus:
        return documents.write_pool(
            self.env.source_root / name, self.size.documents, share=self.size.poison_share
        )

    def reset(self, **faults: Any) -> None:
        """Empty the ledger and set the provider's faults; de-duplication is off unless asked.

        A real provider charges every request it answers, so every scenario runs against one
        that does, and a chunk paid twice shows (ADR 0082); scenario (f) also runs with it on.
        """
        self.wait_idle()
        self.dedupe = bool(faults.get("dedupe", False))
        self.env.reset({**BASE_FAULTS, "dedupe": False, **faults})

    def conf(self, corpus: Corpus) -> dict[str, Any]:
        return {
            "source": str(corpus.folder),
            "batch_size": self.size.batch_size,
            "embed_inputs_per_call": self.size.inputs_per_call,
            "max_bytes": documents.MAX_BYTES,
            "item_timeout_s": 5,
            # PDFium fills 256 MiB with the memory bomb's text in about 1.6 s, well inside
            # item_timeout_s, so the bomb ends as memory, not timeout.
            "memory_mb": 256,
            "max_attempts": 3,
            "lease_s": 60,
        }

    def trigger(self, corpus: Corpus) -> str:
        run_id = self.env.api.trigger(self.conf(corpus))
        self.log(f"   triggered {run_id} over {corpus.documents} documents")
        return run_id

    # -- watching ------------------------------------------------------------------------

    def wait_for(
        self, what: str, probe: Callable[[], T | None], timeout_s: float = 300, every_s: float = 0.3
    ) -> T:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = probe()
            if found is not None and found is not False:
                return found
            time.sleep(every_s)
        raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")

    def running(self, run_id: str, task_id: str | None = None) -> list[dict[str, Any]]:
        """The run's task instances that are running now, with a live task process."""
        found = []
        for ti in self.env.api.task_instances(run_id):
            if ti["state"] != "running" or (task_id and ti["task_id"] != task_id):
                continue
            if task_process(ti) is not None:
                found.append(ti)
        return found

    def wait_idle(self, timeout_s: float = 180) -> None:
        """Wait until no task process is left from an earlier scenario."""
        self.wait_for("task processes to end", lambda: not task_processes(), timeout_s, 1)

    def finish(self, run_id: str) -> tuple[str, int]:
        """Wait for the run; clear what failed once if it failed; return (state, clears)."""
        state = self.env.api.wait(run_id)
        clears = 0
        if state != "success":
            cleared = self.env.api.clear_failed(run_id)
            clears = 1
            self.log(f"   {run_id} ended {state}; cleared {len(cleared)} task instance(s)")
            state = self.env.api.wait(run_id)
        self.log(f"   {run_id}: {state}")
        return state, clears

    def tries(self, run_id: str, task_id: str, map_index: int) -> list[dict[str, Any]]:
        response = self.env.api.request(
            "GET",
            f"/dags/{DAG}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/tries",
        )
        response.raise_for_status()
        return list(response.json()["task_instances"])

    def batch_tries(self, run_id: str) -> dict[str, int]:
        """The try number every batch task instance ended on, for those past their first."""
        return {
            f"{ti['task_id']}[{ti['map_index']}]": ti["try_number"]
            for ti in self.env.api.task_instances(run_id)
            if ti["task_id"].startswith("batch.") and ti["try_number"] > 1
        }

    def reconcile(
        self, runs: list[tuple[str, str, int, Corpus]], *, lost_allowed: int = 0
    ) -> Reconciliation:
        """Reconcile ``runs``; ``lost_allowed``: the provider answers the fault can lose."""
        self.wait_idle()
        return reconcile(
            self.env,
            runs,
            self.env.settle_provider(),
            dedupe=self.dedupe,
            lost_allowed=lost_allowed,
        )

    def in_flight(self) -> int:
        """Requests the provider is serving now: the most a fault at this moment can lose."""
        return int(self.env.model.stats()["in_flight"])


def task_process(ti: dict[str, Any]) -> psutil.Process | None:
    """The live task process of task instance ``ti`` (its title names the TI's id)."""
    if not ti.get("pid"):
        return None
    try:
        proc = psutil.Process(ti["pid"])
        if ti["id"] in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except psutil.Error:
        pass
    return None


def task_processes() -> list[psutil.Process]:
    """Every live Airflow task process on the machine that belongs to this user's Airflow."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        title = " ".join(proc.info["cmdline"] or [])
        # Task processes are titled "airflow worker -- <ti id>"; executor workers carry
        # "LocalExecutor" in theirs.
        if (
            title.startswith("airflow worker -- ")
            and "LocalExecutor" not in title
            and proc.info["status"] != psutil.STATUS_ZOMBIE
        ):
            found.append(proc)
    return found


def _age_s(ti: dict[str, Any]) -> float:
    if not ti.get("start_date"):
        return 0.0
    started = datetime.fromisoformat(ti["start_date"].replace("Z", "+00:00"))
    return (datetime.now(UTC) - started).total_seconds()


def _label(ti: dict[str, Any]) -> str:
    return f"{ti['task_id']}[{ti['map_index']}] try {ti['try_number']}"


# -- the scenarios -------------------------------------------------------------------------


def kill_two_batches(ctx: Context, result: ScenarioResult) -> None:
    """(a) SIGKILL the task processes of two running batches mid-embed."""
    corpus = ctx.corpus("a")
    ctx.reset(latency_ms=SLOW_PROVIDER_MS)
    run_id = ctx.trigger(corpus)
    killed: list[dict[str, Any]] = []

    def victim() -> tuple[dict[str, Any], psutil.Process] | None:
        for ti in ctx.running(run_id, "batch.embed"):
            proc = task_process(ti)
            done_before = {k["map_index"] for k in killed}
            if proc and ti["map_index"] not in done_before and _age_s(ti) >= 2:
                return ti, proc
        return None

    for _ in range(2):
        ti, proc = ctx.wait_for("a running embed batch to kill", victim)
        in_flight = ctx.env.model.stats()["in_flight"]
        proc.kill()
        proc.wait(timeout=30)
        killed.append(
            {
                "task": _label(ti),
                "map_index": ti["map_index"],
                "try": ti["try_number"],
                "provider_requests_in_flight": in_flight,
            }
        )
        ctx.log(f"   SIGKILLed {_label(ti)} (pid {ti['pid']})")
    state, clears = ctx.finish(run_id)
    result.facts["killed"] = [k["task"] for k in killed]
    result.facts["requests in flight at the kills"] = [
        k["provider_requests_in_flight"] for k in killed
    ]
    result.facts["batch tries past the first"] = ctx.batch_tries(run_id)
    for k in killed:
        final = [
            t
            for t in ctx.env.api.task_instances(run_id)
            if t["task_id"] == "batch.embed" and t["map_index"] == k["map_index"]
        ]
        if not final or final[0]["try_number"] <= k["try"]:
            result.checks.append(f"{k['task']} was not tried again after the kill")
    lost = sum(k["provider_requests_in_flight"] for k in killed)
    result.parts.append(
        Part("run", ctx.reconcile([(run_id, state, clears, corpus)], lost_allowed=lost))
    )


def stop_until_retried(ctx: Context, result: ScenarioResult) -> None:
    """(b) SIGSTOP a task process until Airflow starts another try, then let both run."""
    corpus = ctx.corpus("b")
    ctx.reset(latency_ms=SLOW_PROVIDER_MS)
    run_id = ctx.trigger(corpus)

    def victim() -> tuple[dict[str, Any], psutil.Process] | None:
        for ti in ctx.running(run_id, "batch.embed"):
            proc = task_process(ti)
            if proc and _age_s(ti) >= 2:
                return ti, proc
        return None

    ti, proc = ctx.wait_for("a running embed batch to stop", victim)
    # The supervisor (the LocalExecutor worker that forked the task) sends the heartbeats:
    # it is frozen too, or Airflow would never notice. The task's own children go with it.
    supervisor = proc.parent()
    assert supervisor is not None
    family = [proc, *proc.children(recursive=True)]
    frozen = [supervisor, *family]
    in_flight = ctx.in_flight()
    for member in frozen:
        member.suspend()
    stopped = time.monotonic()
    ctx.log(f"   SIGSTOPped {_label(ti)} (pid {ti['pid']}) and its supervisor")

    def next_try() -> dict[str, Any] | None:
        for other in ctx.running(run_id, "batch.embed"):
            if other["map_index"] == ti["map_index"] and other["try_number"] > ti["try_number"]:
                return other
        return None

    try:
        retried = ctx.wait_for("Airflow to start another try", next_try, timeout_s=240)
        retried_after = time.monotonic() - stopped
        for member in family:
            member.resume()
        ctx.log(f"   {_label(retried)} started after {retried_after:.0f} s; old try resumed")
        # Both tries now run at once. The old one's supervisor stays frozen a while longer:
        # once it heartbeats again, Airflow tells it to end the old try.
        overlap_start = time.monotonic()
        new_proc = task_process(retried)
        while time.monotonic() - overlap_start < 15 and proc.is_running():
            if new_proc is None or not new_proc.is_running():
                break
            time.sleep(0.5)
        both_ran_s = time.monotonic() - overlap_start
        old_ran_along = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    finally:
        for member in frozen:
            with contextlib.suppress(psutil.Error):
                member.resume()
    resumed = time.monotonic()
    ended_after: float | None = None
    try:
        proc.wait(timeout=120)
        ended_after = round(time.monotonic() - resumed, 1)
    except psutil.TimeoutExpired:
        result.checks.append("the old try was still running 120 s after its supervisor resumed")
    state, clears = ctx.finish(run_id)
    timeout_s = AIRFLOW_SETTINGS["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"]
    result.facts.update(
        {
            "stopped": _label(ti),
            "heartbeat timeout (s)": int(timeout_s),
            "next try started after (s)": round(retried_after),
            "next try": _label(retried),
            "both tries running at once (s)": round(both_ran_s, 1),
            "old try ended after its supervisor resumed (s)": ended_after,
            "batch tries past the first": ctx.batch_tries(run_id),
        }
    )
    if not old_ran_along or both_ran_s < 1:
        result.checks.append("the two tries did not run at the same time")
    result.facts["requests in flight at the stop"] = in_flight
    result.parts.append(
        Part("run", ctx.reconcile([(run_id, state, clears, corpus)], lost_allowed=in_flight))
    )


def restart_postgres(ctx: Context, result: ScenarioResult) -> None:
    """(c) Restart the replayable database mid-run (fast shutdown, down for a while)."""
    corpus = ctx.corpus("c")
    ctx.reset(latency_ms=SLOW_PROVIDER_MS // 2)
    run_id = ctx.trigger(corpus)
    ctx.wait_for(
        "the first embeddings",
        lambda: ctx.env.scalar("SELECT count(*) FROM replayable.embeddings") > 0,
    )
    running = [_label(ti) for ti in ctx.running(run_id)]
    before = ctx.env.model.stats()
    started = time.monotonic()
    ctx.env.data_pg.stop()
    time.sleep(POSTGRES_DOWN_S)
    ctx.env.data_pg.resume()
    down_s = time.monotonic() - started
    # What the outage can lose: the requests in flight when it began and any begun during it.
    in_flight = before["in_flight"] + ctx.env.model.stats()["requests"] - before["requests"]
    ctx.log(f"   Postgres was down {down_s:.0f} s while {len(running)} task(s) ran")
    state, clears = ctx.finish(run_id)
    result.facts.update(
        {
            "running at the restart": running,
            "postgres down (s)": round(down_s, 1),
            "requests in flight at or begun during the outage": in_flight,
            "batch tries past the first": ctx.batch_tries(run_id),
        }
    )
    if not running:
        result.checks.append("no task was running when Postgres went down")
    result.parts.append(
        Part("run", ctx.reconcile([(run_id, state, clears, corpus)], lost_allowed=in_flight))
    )


def storm_429(ctx: Context, result: ScenarioResult) -> None:
    """(d) Every request refused with 429 and a Retry-After longer than one call may wait."""
    corpus = ctx.corpus("d")
    ctx.reset(status_always=429, retry_after=RETRY_AFTER_S)
    run_id = ctx.trigger(corpus)
    ctx.wait_for(
        "the first 429",
        lambda: ctx.env.model.stats()["by_status"].get("429", 0) > 0,
        timeout_s=300,
    )
    time.sleep(STORM_S)
    refused = ctx.env.model.stats()["by_status"].get("429", 0)
    ctx.env.model.set_faults(BASE_FAULTS)
    ctx.log(f"   storm over: {refused} requests refused")
    state, clears = ctx.finish(run_id)
    waits = []
    for ti in ctx.env.api.task_instances(run_id):
        if ti["task_id"] != "batch.embed" or ti["try_number"] < 2:
            continue
        tries = sorted(
            ctx.tries(run_id, "batch.embed", ti["map_index"]), key=lambda t: t["try_number"]
        )
        for before, after in itertools.pairwise(tries):
            if before.get("end_date") and after.get("start_date"):
                ended = datetime.fromisoformat(before["end_date"].replace("Z", "+00:00"))
                began = datetime.fromisoformat(after["start_date"].replace("Z", "+00:00"))
                waits.append(round((began - ended).total_seconds()))
    result.facts.update(
        {
            "retry-after (s)": RETRY_AFTER_S,
            "storm after the first refusal (s)": STORM_S,
            "requests refused with 429": refused,
            "waits between embed tries (s)": waits,
            "batch tries past the first": ctx.batch_tries(run_id),
        }
    )
    if not waits:
        result.checks.append("no embed task needed another try: the storm outlasted none")
    elif max(waits) < RETRY_AFTER_S * 0.9:
        result.checks.append(f"no task retry waited for Retry-After ({waits})")
    result.parts.append(Part("run", ctx.reconcile([(run_id, state, clears, corpus)])))


def restart_airflow(ctx: Context, result: ScenarioResult) -> None:
    """(e) Restart the scheduler and the API server mid-run, as a deploy does."""
    corpus = ctx.corpus("e")
    ctx.reset(latency_ms=SLOW_PROVIDER_MS // 2)
    run_id = ctx.trigger(corpus)

    def busy() -> list[dict[str, Any]] | None:
        found = [ti for ti in ctx.running(run_id) if ti["task_id"].startswith("batch.")]
        return found if len(found) >= 2 and all(_age_s(ti) >= 1 for ti in found) else None

    hit = ctx.wait_for("two running batches", busy)
    before = ctx.env.model.stats()
    started = time.monotonic()
    # Both at once, as a deploy of the two does: each is stopped (SIGTERM, SIGKILL after
    # 30 s, with its children: the scheduler's LocalExecutor workers and their tasks) and
    # started again.
    with ThreadPoolExecutor(2) as threads:
        list(threads.map(ctx.env.airflow.restart, ["scheduler", "api-server"]))
    if not ctx.env.airflow.wait_until_up():
        raise RuntimeError("the API server did not come back")
    restart_s = time.monotonic() - started
    # The tasks die some time into the restart: what it can lose is the requests in flight
    # when it began and every one begun until it was over.
    in_flight = before["in_flight"] + ctx.env.model.stats()["requests"] - before["requests"]
    ctx.log(f"   scheduler and API server restarted in {restart_s:.0f} s")
    state, clears = ctx.finish(run_id)
    tries = ctx.batch_tries(run_id)
    result.facts.update(
        {
            "running at the restart": [_label(ti) for ti in hit],
            "restart took (s)": round(restart_s),
            "batch tries past the first": tries,
        }
    )
    if not any(f"{ti['task_id']}[{ti['map_index']}]" in tries for ti in hit):
        result.checks.append("no task running at the restart had to be tried again")
    result.facts["requests in flight at or begun during the restart"] = in_flight
    result.parts.append(
        Part("run", ctx.reconcile([(run_id, state, clears, corpus)], lost_allowed=in_flight))
    )


def hangs_and_lost_responses(ctx: Context, result: ScenarioResult) -> None:
    """(f) Requests that hang past the deadline, responses lost after the charge; dedupe off, on."""
    corpus = ctx.corpus("f")
    for dedupe in (False, True):
        ctx.reset(hang_rate=0.05, hang_s=HANG_S, lose_response_rate=0.1, dedupe=dedupe, seed=11)
        run_id = ctx.trigger(corpus)
        state, clears = ctx.finish(run_id)
        timeouts = ctx.env.scalar(
            "SELECT count(*) FROM replayable.model_calls WHERE status = 'read_timeout'"
        )
        # A hang given up at the deadline is charged when it ends; a lost response was charged.
        lost = timeouts + ctx.env.model.stats()["lost_responses"]
        part = ctx.reconcile([(run_id, state, clears, corpus)], lost_allowed=lost)
        provider = part.provider
        label = "de-duplication on" if dedupe else "de-duplication off"
        result.facts[label] = {
            "requests given up after the deadline": timeouts,
            "responses lost after the charge": provider["lost_responses"],
            "charged": provider["charged"],
            "de-duplicated": provider["deduplicated"],
            "would de-duplicate": provider["would_deduplicate"],
            "chunks charged more than once": provider["chunks_charged_more_than_once"],
        }
        if not timeouts or not provider["lost_responses"]:
            result.checks.append(f"{label}: the faults did not fire (hangs and lost responses)")
        if not dedupe and not provider["would_deduplicate"]:
            result.checks.append("de-duplication off: no repeated charge to report")
        if dedupe and not provider["deduplicated"]:
            result.checks.append("de-duplication on: no request was de-duplicated")
        result.parts.append(Part(label, part))
    result.facts["client deadline (s)"] = MODEL_TIMEOUT_S
    result.facts["hang (s)"] = HANG_S


def overlapping_runs(ctx: Context, result: ScenarioResult) -> None:
    """(g) Two runs over overlapping corpora at the same time."""
    first, second = documents.overlapping(
        ctx.env.source_root / "g", ctx.size.documents, share=ctx.size.poison_share
    )
    ctx.reset(latency_ms=SLOW_PROVIDER_MS // 5)
    runs = [ctx.trigger(first), ctx.trigger(second)]
    ended = [ctx.finish(run_id) for run_id in runs]
    shared = len({p.name for p in first.clean} & {p.name for p in second.clean})
    result.facts.update(
        {
            "documents per run": [first.documents, second.documents],
            "documents in both": shared + len(first.poison),
            "batch tries past the first": [ctx.batch_tries(run_id) for run_id in runs],
        }
    )
    result.parts.append(
        Part(
            "both runs",
            ctx.reconcile(
                [
                    (runs[0], *ended[0], first),
                    (runs[1], *ended[1], second),
                ]
            ),
        )
    )


# -- (h)-(l): the holes of issue 15 ------------------------------------------------------

# Scenario (h): leases short enough that a killed task's item is free again soon, long enough
# (three renewals each) that a live task never loses one on a busy machine.
KILLER_LEASE_S = 15
# Its text limit: far below the huge document's 300 MB, far above any clean document's text.
MAX_TEXT_CHARS = 2_000_000
REDRIVE_REASON = "chaos (i): the provider accepts the text now"
OUTAGE_ROUNDS = 20
# Scenario (j): publish rounds back to back stand for the publisher's runs; the backoff of a
# failed delivery shrinks with them, so each round finds the failed events due again.
ROUND_BACKOFF_S = 0.05
RAISED_IN_FLIGHT = 64
PLAN_WITHIN_S = 30


def _doc_id(path: Any) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def poison_that_kills(ctx: Context, result: ScenarioResult) -> None:
    """(h) A 300 MB text layer, and a document on which the task process dies every time.

    The second is killed by the harness, as the kernel's OOM killer would: SIGKILL to the
    task process whenever a task holds that document's extract item. (The extraction itself
    runs in a guarded worker with a memory limit; what kills a task process is memory it
    uses itself, which the text and chunk limits now bound, or memory pressure from
    elsewhere on the machine, which no limit of the task's own can prevent.) Batches are
    claimed whole, so the document gets a batch of its own: its id sorts last and the
    other documents fill whole batches.
    """
    folder = ctx.env.source_root / "h"
    before_killer = 6 * ctx.size.batch_size
    pool = documents.write_pool(folder, before_killer - 1, share=ctx.size.poison_share)
    huge = documents.write_special(folder, "huge_text")
    ids = [_doc_id(path) for path in folder.iterdir()]
    killer = documents.write_special(folder, "kills_task", after=ids)
    corpus = Corpus(folder, pool.clean, (*pool.poison, huge, killer))
    killer_id = _doc_id(killer.path)
    ctx.reset()
    conf = {**ctx.conf(corpus), "batch_size": ctx.size.batch_size, "lease_s": KILLER_LEASE_S}
    known = ctx.env.api.params()
    if "max_text_chars" in known:
        conf["max_text_chars"] = MAX_TEXT_CHARS
    else:
        result.checks.append("the DAG has no max_text_chars param: the text limit is missing")
    run_id = ctx.env.api.trigger(conf)
    ctx.log(f"   triggered {run_id} over {corpus.documents} documents")
    max_attempts = int(conf["max_attempts"])
    kills, settled, kill_after_start_s = _kill_whoever_holds(ctx, run_id, killer_id, max_attempts)
    state, clears = ctx.finish(run_id)
    letters = ctx.env.query(
        "SELECT d.error_class, d.attempts FROM replayable.dead_letters d"
        " WHERE d.doc_id = %s AND d.stage = 'extract' AND d.status = 'open'",
        (killer_id,),
    )
    huge_text = documents.HUGE_PAGES * documents.HUGE_PAGE_CHARS
    result.facts.update(
        {
            "huge document: text layer (characters)": huge_text,
            "huge document: file (bytes)": huge.path.stat().st_size,
            "max_text_chars": conf.get("max_text_chars"),
            "killed tries": kills,
            "seconds from each start to its kill": kill_after_start_s,
            "killer ended": list(settled) if settled else None,
            "killer's dead letter (class, attempts)": [list(r) for r in letters],
            "batch tries past the first": ctx.batch_tries(run_id),
        }
    )
    if not kills:
        result.checks.append("the harness never caught a task holding the killer document")
    if len(kills) > max_attempts:
        result.checks.append(
            f"the killer was taken {len(kills)} times, more than the cap of {max_attempts}"
        )
    if any(attempts > max_attempts for _, attempts in letters):
        result.checks.append("the killer's dead letter counts more attempts than the cap")
    result.parts.append(Part("run", ctx.reconcile([(run_id, state, clears, corpus)])))


def _kill_whoever_holds(
    ctx: Context, run_id: str, doc_id: str, max_attempts: int
) -> tuple[list[str], tuple[Any, ...] | None, list[float]]:
    """SIGKILL the task process of every try that starts work on ``doc_id``'s extract item.

    Return the tries killed, the item's row once it is done or dead (None if the run ended
    first), and the seconds from each start to its kill. A try that takes the item over holds
    it unstarted at first (ADR 0084: no attempt spent until the runner starts it, just before
    the work); only a started item is one the task is working on, as the OOM killer would
    find it. A started item is held only for the guarded pool's start and the extraction
    (under a second), so the watch must be quick: the item's row is polled every few
    milliseconds on one open connection, and the running extract tries' processes are looked
    up ahead, not after the start is seen.
    """
    kills: list[str] = []
    after_start: list[float] = []
    processes: dict[tuple[int, int], tuple[str, psutil.Process]] = {}
    last_lookup = next_state_check = 0.0
    with ctx.env.connection() as conn:
        conn.autocommit = True
        with conn.cursor() as cur:
            while True:
                cur.execute(
                    "SELECT status, attempts, map_index, try_number, error_class,"
                    " extract(epoch FROM clock_timestamp() - started_at)"
                    " FROM replayable.stage_runs WHERE stage = 'extract' AND doc_id = %s"
                    " AND is_current AND run_id = %s",
                    (doc_id, run_id),
                )
                row = cur.fetchone()
                if row and row[0] in ("done", "dead"):
                    return kills, row[:5], after_start
                now = time.monotonic()
                held = (
                    row is not None
                    and row[0] == "running"
                    and row[5] is not None  # started: the task is working on it
                    and len(kills) <= max_attempts + 1
                )
                key = (row[2], row[3]) if held and row else None
                # Every 0.2 s, and every 20 ms while a starting try is not known yet.
                if now - last_lookup > (0.02 if key and key not in processes else 0.2):
                    for ti in ctx.running(run_id, "batch.extract"):
                        proc = task_process(ti)
                        if proc is not None:
                            processes[(ti["map_index"], ti["try_number"])] = (_label(ti), proc)
                    last_lookup = now
                if key is not None and key in processes and row:
                    label, proc = processes[key]
                    if label not in kills:
                        with contextlib.suppress(psutil.NoSuchProcess):
                            proc.kill()
                        kills.append(label)
                        after_start.append(round(float(row[5]), 3))
                        ctx.log(f"   SIGKILLed {label} holding the killer (attempt {row[1]})")
                if now > next_state_check:
                    if ctx.env.api.state(run_id) in ("success", "failed"):
                        return kills, None, after_start
                    next_state_check = now + 2
                time.sleep(0.005)


def _sync_waiter(ctx: Context) -> tuple[int, bool] | None:
    """A session whose commit waits for the standby: (pid, whether it wrote run_docs)."""
    rows = ctx.env.query(
        "SELECT a.pid, EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid"
        " AND l.relation = 'replayable.run_docs'::regclass)"
        " FROM pg_stat_activity a WHERE a.wait_event = 'SyncRep'"
    )
    return (int(rows[0][0]), bool(rows[0][1])) if rows else None


def redrive_plan_killed_after_commit(ctx: Context, result: ScenarioResult) -> None:
    """(i) A redrive whose plan is killed after its selection committed, and retried.

    The first run dead-letters the documents the provider refuses (400); the provider is then
    fixed and a redrive of those letters triggered. Its plan's commit is held after it is
    durable (:meth:`EmbeddedPostgres.hold_commits`): the harness SIGKILLs the plan task
    process there, then lets the commit go. Airflow retries plan, which selects again.
    """
    corpus = ctx.corpus("i")
    ctx.reset()
    first = ctx.trigger(corpus)
    state, clears = ctx.finish(first)
    result.parts.append(Part("first run", ctx.reconcile([(first, state, clears, corpus)])))
    refused = tuple(p.path for p in corpus.poison if p.kind == "provider_400")
    ctx.env.model.set_faults({"dedupe": False})  # the provider accepts the text now
    letters_before = ctx.env.scalar(
        "SELECT count(*) FROM replayable.dead_letters"
        " WHERE status = 'open' AND stage = 'embed' AND error_class = 'http_400'"
    )
    conf = {
        **ctx.conf(corpus),
        "redrive": {"stage": "embed", "error_class": ["http_400"], "reason": REDRIVE_REASON},
    }
    killed: str | None = None
    released = 0
    open_after_kill: int | None = None
    ctx.env.data_pg.hold_commits(True)
    try:
        run_id = ctx.env.api.trigger(conf)
        ctx.log(f"   triggered redrive {run_id}; commits are held")
        deadline = time.monotonic() + 300
        while killed is None and time.monotonic() < deadline:
            waiter = _sync_waiter(ctx)
            if waiter is not None and not waiter[1]:
                # Some other commit (not the selection's): let every held commit go, hold again.
                ctx.env.data_pg.hold_commits(False)
                ctx.env.data_pg.hold_commits(True)
                released += 1
            elif waiter is not None:
                for ti in ctx.running(run_id, "plan"):
                    proc = task_process(ti)
                    if proc is not None:
                        proc.kill()
                        proc.wait(timeout=30)
                        killed = _label(ti)
                        ctx.log(f"   SIGKILLed {killed} after its selection's commit")
            time.sleep(0.05)
    finally:
        ctx.env.data_pg.hold_commits(False)
    if killed is None:
        result.checks.append("plan's selection never committed while the harness watched")
    else:
        open_after_kill = ctx.env.scalar(
            "SELECT count(*) FROM replayable.dead_letters"
            " WHERE status = 'open' AND stage = 'embed' AND error_class = 'http_400'"
        )
    state, clears = ctx.finish(run_id)
    plan = [t for t in ctx.env.api.task_instances(run_id) if t["task_id"] == "plan"]
    closed_unprocessed = ctx.env.scalar(
        "SELECT count(*) FROM replayable.dead_letters d WHERE d.status = 'redriven'"
        " AND NOT EXISTS (SELECT 1 FROM replayable.stage_runs s WHERE s.stage = d.stage"
        " AND s.doc_id = d.doc_id AND s.is_current AND s.status = 'done')"
    )
    still_open = ctx.env.scalar(
        "SELECT count(*) FROM replayable.dead_letters"
        " WHERE status = 'open' AND stage = 'embed' AND error_class = 'http_400'"
    )
    result.facts.update(
        {
            "letters redriven": letters_before,
            "killed": killed,
            "letters open after the kill": open_after_kill,
            "other commits let through while holding": released,
            "plan tries": plan[0]["try_number"] if plan else None,
            "letters closed without their item done": closed_unprocessed,
            "letters of the redrive still open": still_open,
        }
    )
    if letters_before != len(refused):
        result.checks.append(f"{letters_before} letters to redrive, {len(refused)} expected")
    if plan and plan[0]["try_number"] < 2:
        result.checks.append("plan was not tried again after the kill")
    if closed_unprocessed:
        result.checks.append(f"{closed_unprocessed} letter(s) closed without their item done")
    if still_open:
        result.checks.append(f"{still_open} letter(s) of the redrive left open")
    redriven = Corpus(corpus.folder, refused, ())
    result.parts.append(Part("redrive", ctx.reconcile([(run_id, state, clears, redriven)])))


BACKLOG_ALERT = "ReplayableOutboxBacklog"
# outbox_publisher runs every 10 minutes: a round stands for that much time, scraped each minute.
ROUND_MINUTES = 10
Sample = tuple[str, tuple[tuple[str, str], ...]]


def _outbox_samples(env: ChaosEnv) -> dict[Sample, float]:
    """One scrape of the metrics the UI serves: every ``replayable_outbox_*`` sample."""
    from prometheus_client.parser import text_string_to_metric_families

    from replayable.web import metrics

    with env.connection() as conn:
        body, _ = metrics.render(conn)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name.startswith("replayable_outbox_")
    }


def _humanize(value: float) -> str:
    """Prometheus's ``humanize`` for the values a backlog takes (no unit below 1,000)."""
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.4g}{unit}"
    return f"{value:.4g}"


def _backlog_alert_fires(scrapes: list[dict[Sample, float]]) -> tuple[bool | None, str]:
    """Whether monitoring/alerts.yml's backlog alert fires at the end of ``scrapes``.

    promtool evaluates the rule as written (its ``for`` included) over the scraped outbox
    series, each scrape standing for one publisher round of :data:`ROUND_MINUTES`. Without
    promtool the answer is None, with the reason.
    """
    import subprocess
    import tempfile
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    rules = root / "monitoring" / "alerts.yml"
    rule = next(
        (
            r
            for group in yaml.safe_load(rules.read_text())["groups"]
            for r in group["rules"]
            if r.get("alert") == BACKLOG_ALERT
        ),
        None,
    )
    if rule is None:
        return False, f"monitoring/alerts.yml has no rule {BACKLOG_ALERT}"
    found = subprocess.run(
        [str(root / "monitoring" / "install-promtool.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if found.returncode != 0:
        return None, f"no promtool: {found.stderr.strip()}"
    promtool = found.stdout.strip().splitlines()[-1]
    keys = sorted({key for scrape in scrapes for key in scrape})
    series = []
    for name, labels in keys:
        values = [scrape.get((name, labels), 0.0) for scrape in scrapes]
        text = " ".join(f"{v:g}" for v in values for _ in range(ROUND_MINUTES))
        selector = ", ".join(f'{k}="{v}"' for k, v in labels)
        series.append({"series": f"{name}{{{selector}}}", "values": text})
    pending = scrapes[-1].get(("replayable_outbox_events", (("status", "pending"),)), 0.0)
    annotations = {
        key: str(value).replace("{{ $value | humanize }}", _humanize(pending))
        for key, value in rule.get("annotations", {}).items()
    }
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": f"{len(scrapes) * ROUND_MINUTES - 1}m",
                        "alertname": BACKLOG_ALERT,
                        "exp_alerts": [
                            {"exp_labels": rule.get("labels", {}), "exp_annotations": annotations}
                        ],
                    }
                ],
            }
        ],
    }
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "outage.test.yml"
        path.write_text(yaml.safe_dump(test, sort_keys=False))
        done = subprocess.run(
            [promtool, "test", "rules", str(path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    return done.returncode == 0, (done.stdout + done.stderr).strip()[-600:]


def webhook_outage(ctx: Context, result: ScenarioResult) -> None:
    """(j) The webhook receiver down for 20 publish rounds, then back.

    The run's own publish task meets the outage first. Then 20 rounds of the publisher (the
    library's ``publish``, as the outbox_publisher DAG runs it, back to back) meet it: ten
    answered 503 and ten 404, as a proxy in front of a receiver that is down or gone answers.
    The outbox metrics are scraped after each round; promtool evaluates the backlog alert of
    monitoring/alerts.yml over them. Then the receiver is back and rounds run until the
    backlog is empty.
    """
    from replayable import db
    from replayable.airflow.sinks import WebhookSink, webhook_settings
    from replayable.outbox import PublishLimits, publish

    folder = ctx.env.source_root / "j"
    corpus = documents.write_pool(
        folder, max(30, ctx.size.documents // 3), share=ctx.size.poison_share
    )
    ctx.reset(webhook_status_always=503)
    run_id = ctx.trigger(corpus)
    state, clears = ctx.finish(run_id)
    limits = PublishLimits(backoff_base_s=ROUND_BACKOFF_S)
    settings = webhook_settings(ctx.env.webhook_url, None, None, None, WEBHOOK_EXTRA)
    database = db.Database(ctx.env.dsn)
    scrapes = [_outbox_samples(ctx.env)]

    def rounds(count: int, label: str) -> list[dict[str, Any]]:
        seen = []
        for n in range(count):
            with WebhookSink(settings) as sink:
                done = publish(
                    database,
                    sink,
                    owner=f"chaos-j-{label}-{n}",
                    publication=f"chaos-j/{label}/{n}",
                    limits=limits,
                )
            scrapes.append(_outbox_samples(ctx.env))
            seen.append(done.summary())
            time.sleep(ROUND_BACKOFF_S * 2)
        return seen

    def statuses() -> dict[str, int]:
        return dict(ctx.env.query("SELECT status, count(*) FROM replayable.outbox GROUP BY 1"))

    # Every failed delivery logs a warning: 20 rounds of them would bury the scenario's output.
    outbox_log = logging.getLogger("replayable.outbox")
    level = outbox_log.level
    outbox_log.setLevel(logging.ERROR)
    try:
        rounds(OUTAGE_ROUNDS // 2, "down-503")
        ctx.env.model.set_faults({**BASE_FAULTS, "dedupe": False, "webhook_status_always": 404})
        rounds(OUTAGE_ROUNDS - OUTAGE_ROUNDS // 2, "down-404")
        after_outage = statuses()
        outage = list(scrapes)
        ctx.env.model.set_faults({**BASE_FAULTS, "dedupe": False})
        after: list[dict[str, Any]] = []
        for _ in range(10):
            after += rounds(1, "back")
            if not statuses().get("pending"):
                break
        final = statuses()
    finally:
        outbox_log.setLevel(level)
        database.close()
    fired, said = _backlog_alert_fires(outage)
    pending = ("replayable_outbox_events", (("status", "pending"),))
    events = ctx.env.scalar("SELECT count(*) FROM replayable.outbox")
    stored = len(ctx.env.model.webhook_events(WEBHOOK))
    result.facts.update(
        {
            "events": events,
            "outbox after the outage": after_outage,
            "outbox at the end": final,
            "backlog gauge per round (outage)": [s.get(pending) for s in outage],
            f"{BACKLOG_ALERT} fires at the outage's end (promtool)": fired,
            "rounds after the receiver came back": len(after),
            "backlog gauge at the end": scrapes[-1].get(pending),
            "events the receiver stored": stored,
        }
    )
    if after_outage.get("dead") or final.get("dead"):
        result.checks.append(f"events dead after the outage: {final.get('dead', 0)}")
    if final.get("pending"):
        result.checks.append(f"backlog left after the receiver came back: {final['pending']}")
    if fired is None:
        result.checks.append(f"the backlog alert could not be evaluated: {said}")
    elif not fired:
        result.checks.append(f"{BACKLOG_ALERT} did not fire during the outage: {said}")
    if scrapes[-1].get(pending) != 0:
        result.checks.append(f"the backlog gauge ended at {scrapes[-1].get(pending)}, not 0")
    if stored != events:
        result.checks.append(f"the receiver stored {stored} events of {events}")
    result.parts.append(Part("run", ctx.reconcile([(run_id, state, clears, corpus)])))


def raised_in_flight(ctx: Context, result: ScenarioResult) -> None:
    """(k) Two runs at once, one asking for 64 requests in flight against a connection's 4."""
    first = documents.write_pool(
        ctx.env.source_root / "k" / "first", ctx.size.documents, share=ctx.size.poison_share
    )
    # Other documents than the first run's: both runs have all their chunks to embed.
    second = documents.write_pool(
        ctx.env.source_root / "k" / "second",
        ctx.size.documents,
        share=ctx.size.poison_share,
        first=ctx.size.documents + 1,
    )
    ctx.reset(latency_ms=SLOW_PROVIDER_MS // 2)
    plain = ctx.trigger(first)
    raised = ctx.env.api.trigger({**ctx.conf(second), "max_in_flight": RAISED_IN_FLIGHT})
    ctx.log(f"   triggered {raised} asking for max_in_flight {RAISED_IN_FLIGHT}")
    ended = [ctx.finish(run_id) for run_id in (plain, raised)]
    part = ctx.reconcile([(plain, *ended[0], first), (raised, *ended[1], second)])
    peak = part.provider["peak_in_flight"]
    result.facts.update(
        {
            "connection's max_in_flight": MODEL_MAX_IN_FLIGHT,
            "conf's max_in_flight (second run)": RAISED_IN_FLIGHT,
            "provider's peak requests in flight": peak,
            "requests": part.provider["requests"],
        }
    )
    if peak > MODEL_MAX_IN_FLIGHT:
        result.checks.append(
            f"the provider saw {peak} requests in flight, over the connection's "
            f"{MODEL_MAX_IN_FLIGHT}"
        )
    result.parts.append(Part("both runs", part))


def symlink_loop(ctx: Context, result: ScenarioResult) -> None:
    """(l) A source folder with two links back to itself, listed by a recursive glob."""
    folder = ctx.env.source_root / "l"
    corpus = documents.write_pool(
        folder, max(20, ctx.size.documents // 6), share=ctx.size.poison_share
    )
    for name in ("a", "b"):
        (folder / name).symlink_to(".", target_is_directory=True)
    ctx.reset()
    conf = {**ctx.conf(corpus), "source": f"{folder}/**/*.pdf"}
    run_id = ctx.env.api.trigger(conf)
    ctx.log(f"   triggered {run_id} over {conf['source']}")

    def plan_ended() -> dict[str, Any] | None:
        for ti in ctx.env.api.task_instances(run_id):
            if ti["task_id"] == "plan" and ti["state"] in ("success", "failed", "up_for_retry"):
                return ti
        return None

    try:
        plan = ctx.wait_for("plan to end", plan_ended, timeout_s=PLAN_WITHIN_S * 4, every_s=1)
    except TimeoutError:
        for ti in ctx.running(run_id, "plan"):
            proc = task_process(ti)
            if proc is not None:
                proc.kill()
        ctx.env.api.fail_run(run_id)
        result.checks.append(f"plan was still listing after {PLAN_WITHIN_S * 4} s; stopped")
        plan = None
    state, clears = ctx.finish(run_id)
    took = round(float(plan["duration"]), 1) if plan and plan.get("duration") else None
    result.facts.update(
        {"source": conf["source"], "links": ["a -> .", "b -> ."], "plan took (s)": took}
    )
    if took is not None and took > PLAN_WITHIN_S:
        result.checks.append(f"plan took {took} s, over {PLAN_WITHIN_S} s")
    result.parts.append(Part("run", ctx.reconcile([(run_id, state, clears, corpus)])))


SCENARIOS: dict[str, tuple[str, Callable[[Context, ScenarioResult], None]]] = {
    "a": ("SIGKILL the task processes of two running batches", kill_two_batches),
    "b": ("SIGSTOP a task until Airflow starts another try, then both run", stop_until_retried),
    "c": ("restart Postgres mid-run", restart_postgres),
    "d": ("a 429 storm with Retry-After that outlasts one task try", storm_429),
    "e": ("restart the scheduler and the API server mid-run", restart_airflow),
    "f": ("hangs past the deadline and responses lost after the charge", hangs_and_lost_responses),
    "g": ("two runs over overlapping corpora at once", overlapping_runs),
    "h": ("a 300 MB text layer, and a document that kills its task every time", poison_that_kills),
    "i": (
        "a redrive whose plan is killed after its commit, then retried",
        redrive_plan_killed_after_commit,
    ),
    "j": ("the webhook receiver down for 20 publish rounds, then back", webhook_outage),
    "k": ("two runs at once, one asking for 64 requests in flight against 4", raised_in_flight),
    "l": ("a source folder with two symlinks back to itself", symlink_loop),
}


def run_scenario(ctx: Context, key: str) -> ScenarioResult:
    """Run scenario ``key``; an exception is recorded as a failed check, not raised."""
    title, body = SCENARIOS[key]
    result = ScenarioResult(key, title)
    ctx.log(f"== ({key}) {title}")
    started = time.monotonic()
    try:
        body(ctx, result)
        result.checks += ledger_violations(ctx, result)
    except Exception as error:  # a scenario that breaks is a failed scenario, with the reason
        result.checks.append(f"the scenario broke: {type(error).__name__}: {error}")
    result.seconds = time.monotonic() - started
    return result


# Violations a failed scenario lists, at most: the check's count says how many there were.
SHOWN_VIOLATIONS = 20


def ledger_violations(ctx: Context, result: ScenarioResult) -> list[str]:
    """``replayable check`` on the ledger the scenario left, every run ended (ADR 0150):
    each violation is a failed check of the scenario, and the count is one of its facts."""
    from replayable.invariants import check_ledger

    with ctx.env.connection() as conn:
        found = check_ledger(conn, quiescent=True)
    result.facts["replayable check"] = f"{len(found)} violation(s)" if found else "clean"
    shown = [
        f"replayable check: {v.invariant} in {v.stage}, document {(v.doc_id or '?')[:12]}, "
        f"item {(v.item_key or '?')[:12]}: {v.detail}"
        for v in found[:SHOWN_VIOLATIONS]
    ]
    if len(found) > SHOWN_VIOLATIONS:
        shown.append(f"replayable check: and {len(found) - SHOWN_VIOLATIONS} more")
    return shown
