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
from chaos.env import AIRFLOW_SETTINGS, DAG, MODEL_TIMEOUT_S, ChaosEnv
from chaos.reconcile import Reconciliation, format_table, reconcile

T = TypeVar("T")

BASE_FAULTS: dict[str, Any] = {"fail_inputs_containing": {PROVIDER_POISON_MARKER: 400}}
# A slow provider keeps embed tasks running long enough to be hit mid-work.
SLOW_PROVIDER_MS = 1000
POSTGRES_DOWN_S = 10
RETRY_AFTER_S = 65  # longer than one call may wait (CallRetry.max_total_s = 60)
STORM_S = 30  # the storm lasts this long after its first refusal
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

    # -- set-up --------------------------------------------------------------------------

    def corpus(self, name: str) -> Corpus:
        return documents.write_pool(
            self.env.source_root / name, self.size.documents, share=self.size.poison_share
        )

    def reset(self, **faults: Any) -> None:
        self.wait_idle()
        self.env.reset({**BASE_FAULTS, **faults})

    def conf(self, corpus: Corpus) -> dict[str, Any]:
        return {
            "source": str(corpus.folder),
            "batch_size": self.size.batch_size,
            "embed_inputs_per_call": self.size.inputs_per_call,
            "max_bytes": documents.MAX_BYTES,
            "item_timeout_s": 5,
            "memory_mb": 512,
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
        self, runs: list[tuple[str, str, int, Corpus]], *, dedupe: bool = True
    ) -> Reconciliation:
        self.wait_idle()
        return reconcile(self.env, runs, self.env.settle_provider(), dedupe=dedupe)


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
    result.parts.append(Part("run", ctx.reconcile([(run_id, state, clears, corpus)])))


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
    result.parts.append(Part("run", ctx.reconcile([(run_id, state, clears, corpus)])))


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
    started = time.monotonic()
    ctx.env.data_pg.stop()
    time.sleep(POSTGRES_DOWN_S)
    ctx.env.data_pg.resume()
    down_s = time.monotonic() - started
    ctx.log(f"   Postgres was down {down_s:.0f} s while {len(running)} task(s) ran")
    state, clears = ctx.finish(run_id)
    result.facts.update(
        {
            "running at the restart": running,
            "postgres down (s)": round(down_s, 1),
            "batch tries past the first": ctx.batch_tries(run_id),
        }
    )
    if not running:
        result.checks.append("no task was running when Postgres went down")
    result.parts.append(Part("run", ctx.reconcile([(run_id, state, clears, corpus)])))


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
    started = time.monotonic()
    # Both at once, as a deploy of the two does: each is stopped (SIGTERM, SIGKILL after
    # 30 s, with its children: the scheduler's LocalExecutor workers and their tasks) and
    # started again.
    with ThreadPoolExecutor(2) as threads:
        list(threads.map(ctx.env.airflow.restart, ["scheduler", "api-server"]))
    if not ctx.env.airflow.wait_until_up():
        raise RuntimeError("the API server did not come back")
    restart_s = time.monotonic() - started
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
    result.parts.append(Part("run", ctx.reconcile([(run_id, state, clears, corpus)])))


def hangs_and_lost_responses(ctx: Context, result: ScenarioResult) -> None:
    """(f) Requests that hang past the deadline, responses lost after the charge; dedupe off, on."""
    corpus = ctx.corpus("f")
    for dedupe in (False, True):
        ctx.reset(hang_rate=0.1, hang_s=HANG_S, lose_response_rate=0.1, dedupe=dedupe, seed=11)
        run_id = ctx.trigger(corpus)
        state, clears = ctx.finish(run_id)
        timeouts = ctx.env.scalar(
            "SELECT count(*) FROM replayable.model_calls WHERE status = 'read_timeout'"
        )
        part = ctx.reconcile([(run_id, state, clears, corpus)], dedupe=dedupe)
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


SCENARIOS: dict[str, tuple[str, Callable[[Context, ScenarioResult], None]]] = {
    "a": ("SIGKILL the task processes of two running batches", kill_two_batches),
    "b": ("SIGSTOP a task until Airflow starts another try, then both run", stop_until_retried),
    "c": ("restart Postgres mid-run", restart_postgres),
    "d": ("a 429 storm with Retry-After that outlasts one task try", storm_429),
    "e": ("restart the scheduler and the API server mid-run", restart_airflow),
    "f": ("hangs past the deadline and responses lost after the charge", hangs_and_lost_responses),
    "g": ("two runs over overlapping corpora at once", overlapping_runs),
}


def run_scenario(ctx: Context, key: str) -> ScenarioResult:
    """Run scenario ``key``; an exception is recorded as a failed check, not raised."""
    title, body = SCENARIOS[key]
    result = ScenarioResult(key, title)
    ctx.log(f"== ({key}) {title}")
    started = time.monotonic()
    try:
        body(ctx, result)
    except Exception as error:  # a scenario that breaks is a failed scenario, with the reason
        result.checks.append(f"the scenario broke: {type(error).__name__}: {error}")
    result.seconds = time.monotonic() - started
    return result
