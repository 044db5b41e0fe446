"""The simulation: a seeded random walk over the pipeline's features, checked after each step.

One :class:`Walk` drives the real ledger, the real runner (document_pipeline's tasks in this
process, tests/in_process.py) and the real local model server. Each step is drawn from
:data:`RULES` by a ``random.Random(seed)``; after each one the ledger's invariants
(:func:`replayable.invariants.check_ledger`) and the provider's books are checked. At the end
the walk clears the provider's faults, runs every settings profile it used until nothing is
left to do, and checks again at quiescence. A failure names the seed and every step taken,
so ``make simulate SEED=…`` walks the same way again (ADR 0136).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import corpus
import in_process
from devtools.model_server import LocalModelServer
from in_process import PipelineInProcess
from replayable.airflow import tasks as dag_tasks
from replayable.airflow.tasks import common as task_common
from replayable.invariants import Violation, check_ledger, count_violations
from replayable.retry import CallRetry
from replayable.runner import processing
from replayable.stages import extract

# Findings of issue 36 whose fix has not landed yet: the rules that walk into them are off
# until it does (remove an id when its fix is merged). Every fix has landed: 1 (a refused
# chunk shared by two documents floods the provider: poisoned copies and boilerplate), 3 (a
# sync run over chunks a live batch holds pays again: a worker killed while its batch
# waits), 11 (a redrive under a new code version leaves a done document with an open letter:
# a version bump) and 11b, its twin this walk found (a run under other settings finishes a
# document whose old item died and leaves that letter open, or lets it die with a second).
#
# 8b, which this walk found with finding 8's fix in place, is fixed too: a chunk whose line a
# completed batch lost (charged, no result; ADR 0146) was bought again by a sync-mode run of
# another document holding it (seed 8 at 26 steps). Its rule is the harm that loses lines.
KNOWN_HOLES: frozenset[str] = frozenset()
# To walk into them anyway (to show a hole is found with its fix reverted), name the holes
# still to avoid in this variable, comma-separated; empty turns every rule on.
KNOWN_HOLES_ENV = "REPLAYABLE_SIM_KNOWN_HOLES"
if KNOWN_HOLES_ENV in os.environ:
    KNOWN_HOLES = frozenset(h.strip() for h in os.environ[KNOWN_HOLES_ENV].split(",") if h.strip())

# The settings a run may be drawn with: each profile is a distinct key (model, dimensions,
# chunk size, extractor); the mode is drawn apart, since it is not part of any key.
PROFILES: tuple[dict[str, Any], ...] = (
    {},
    {"chunk_size": 400},
    {"model": "sim-alt-embed", "dimensions": 16, "chunk_size": 400, "extractor": "pypdf"},
    # The default model at another size: one model's vectors at two sizes (ADR 0151).
    {"dimensions": 16},
)
# Every run's own limits: short leases, so a killed worker's items are taken over in seconds.
BASE_CONF: dict[str, Any] = {
    "batch_size": 3,
    "lease_s": 5,
    "item_timeout_s": 4,
    "batch_poll_s": 0.1,
    "max_retry_after_s": 1,
}
MAX_ATTEMPTS = 3
# A word the provider refuses (a 400), in the poisoned documents' text only.
POISON = "QUARANTINED"
# A paragraph shared by several documents, first, and longer than a chunk under every
# profile (chunk_size 800 at most), so that their first chunk is the same: the boilerplate
# alone. A poisoned one holds the poison word just after it, in a chunk of its own text.
BOILERPLATE = (
    "Confidential. This report is provided under the terms of the master services agreement "
    "and may not be shared outside the receiving organisation without written consent. "
    "All figures are unaudited and subject to revision at the end of the quarter. "
    "Nothing in this report is an offer, a solicitation or advice of any kind, and no "
    "representation or warranty is given as to the accuracy or completeness of its "
    "contents. The receiving organisation is responsible for its own assessment of the "
    "matters described, and for any decision it takes in reliance on them. Forecasts are "
    "estimates made in good faith on the information available when the report was "
    "prepared, and actual results may differ materially. Questions about this report, its "
    "distribution or its terms should be addressed to the account team named in the "
    "agreement, who will answer them within five working days of receipt."
)
WORDS = [
    "harbour",
    "lantern",
    "quarry",
    "meadow",
    "signal",
    "copper",
    "ledger",
    "orchard",
    "basin",
    "timber",
    "falcon",
    "glacier",
    "pepper",
    "violet",
    "anchor",
    "marble",
    "saddle",
    "thunder",
    "cobalt",
    "willow",
    "ember",
    "prairie",
    "canyon",
    "mosaic",
    "beacon",
    "spindle",
    "tundra",
    "walnut",
    "harvest",
    "compass",
    "lagoon",
    "summit",
    "cinder",
    "thistle",
]
# Faults every setting keeps: the provider's de-duplication off (every repeat is charged, so
# a chunk bought twice shows), a chunk with the poison word refused with a 400 (so a poisoned
# document is a refused chunk, in every mode and under every profile), seeded draws, and
# batches that end within a second.
BASE_FAULTS: dict[str, Any] = {
    "dedupe": False,
    "fail_inputs_containing": {POISON: 400},
    "batch_delay_s": 0.3,
}
# The provider's harms; "off" clears them. Each is a fault config over BASE_FAULTS.
HARMS: dict[str, dict[str, Any]] = {
    "off": {},
    "throttle": {"status_rates": {"429": 0.3}, "retry_after": 0.2},
    "flaky": {"status_rates": {"500": 0.15, "503": 0.15}, "retry_after": 0.1},
    "outage": {"status_always": 503, "retry_after": 0.1},
    "expire": {"batch_expire_after_fraction": 0.5},
    "cancel": {"batch_cancel_after_fraction": 0.5, "batch_delay_s": 2},
    "lose": {"lose_response_rate": 0.3},
    # A completed batch that charges some lines and returns no result for them: the product
    # never sends such a line again (ADR 0146), so these charges are not lost answers to the
    # provider check; a chunk of one bought again is a violation.
    "lose_lines": {"batch_lose_lines_rate": 0.3},
}
# Harms that walk into a known hole (KNOWN_HOLES), by the hole's id: left out while it is.
HARM_HOLES: dict[str, str] = {"lose_lines": "8b"}
# The embed items dead because the provider refused an input as bad: a terminal 4xx class (a
# sync request's status, or a batch line's, ADR 0146). Only the poison word is ever refused,
# so a document dead with one must hold it; the other harms (an outage, lost answers or
# lines, batches expired) kill documents under other classes.
DEAD_REFUSED = (
    "SELECT r.doc_id, d.uri, r.item_key, r.error_class, r.last_error"
    " FROM replayable.stage_runs r JOIN replayable.documents d USING (doc_id)"
    " WHERE r.stage = 'embed' AND r.status = 'dead' AND r.error_kind = 'terminal'"
    " AND r.error_class ~ '^http_4[0-9][0-9]$' ORDER BY d.uri"
)
# Documents the walk starts with, before its first drawn step.
FIRST_DOCUMENTS = 2
# A copy is of one of the last few documents added, often one no run has seen yet: two
# owners of the same chunks then meet in one run.
RECENT_DOCUMENTS = 4
# Runs of the last profile at the end, until no item is left pending, running or failed.
DRAIN_ROUNDS = 4


class WorkerKilled(BaseException):
    """A worker killed mid-batch: nothing of it runs on, and its leases are abandoned."""


class Runaway(BaseException):
    """A run that never ends: its stage task deferred more often than any run needs."""


# A run's stage tasks defer once per provider batch they wait for: a try per attempt at
# most, for each of its mapped batches. More than this in one run is a loop, not a wait.
MAX_DEFERRALS_PER_RUN = 40


@dataclass
class Doc:
    name: str
    text_parts: list[str]
    poisoned: bool


@dataclass
class Walk:
    """One walk: its seed, the steps taken, and the world it drives."""

    seed: int
    folder: Path
    run: PipelineInProcess
    conn: Any
    model: LocalModelServer
    monkeypatch: pytest.MonkeyPatch
    rng: random.Random = field(init=False)
    steps: list[str] = field(default_factory=list)
    docs: list[Doc] = field(default_factory=list)
    last_profile: int = 0
    harm: str = "off"
    bumps: int = 0
    runs: int = 0  # runs in the current step

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.model.clear_faults()
        self.model.reset_stats()
        self._set_faults("off")
        for _ in range(FIRST_DOCUMENTS):
            self.steps.append(f"start: {self.add_new()}")

    # -- the rules ---------------------------------------------------------------------

    def add_new(self) -> str:
        poisoned = self.rng.random() < 0.25
        return self._write([self._paragraph(poisoned)], poisoned)

    def add_copy(self) -> str:
        """A byte-different copy of a recent document: the same text, another doc_id."""
        recent = self.docs[-RECENT_DOCUMENTS:]
        sources = [d for d in recent if "1" not in KNOWN_HOLES or not d.poisoned]
        if not sources:
            return self.add_new()
        source = self.rng.choice(sources)
        name = self._write(source.text_parts, source.poisoned, salt=f"copy of {source.name}")
        return f"{name} copies {source.name}"

    def add_boilerplate(self) -> str:
        """A document that opens with the shared boilerplate paragraph."""
        poisoned = "1" not in KNOWN_HOLES and self.rng.random() < 0.5
        parts = [BOILERPLATE + (f" {POISON}." if poisoned else ""), self._paragraph(False)]
        return self._write(parts, poisoned)

    def run_stage(self) -> str:
        profile = self._profile()
        mode = self.rng.choice(("sync", "batch"))
        self._doing(f"run profile {profile} {mode}")
        report = self._run(self._conf(profile, embed_mode=mode))
        return f"run profile {profile} {mode}: {self._summary(report)}"

    def harm_provider(self) -> str:
        harms = [h for h in sorted(HARMS) if HARM_HOLES.get(h) not in KNOWN_HOLES]
        self._set_faults(self.rng.choice(harms))
        return f"provider {self.harm}"

    def kill_worker(self) -> str:
        """A run whose worker dies in one stage, its items claimed and leased, never finished."""
        stage = self.rng.choice(("extract", "chunk", "embed"))
        profile = self._profile()
        mode = self.rng.choice(("sync", "batch"))
        original = processing.Processing.run

        def killed(process: Any) -> Any:
            if process.batch.spec.name == stage:
                raise WorkerKilled(stage)
            return original(process)

        with self.monkeypatch.context() as patch:
            patch.setattr(processing.Processing, "run", killed)
            try:
                self._run(self._conf(profile, embed_mode=mode))
            except WorkerKilled:
                return f"kill worker in {stage} (profile {profile} {mode})"
        return f"kill worker in {stage} (profile {profile} {mode}): nothing to kill"

    def kill_batch_waiter(self) -> str:
        """A batch-mode run killed while its submission waits at the provider."""
        profile = self._profile()

        async def killed(trigger: Any) -> Any:
            raise WorkerKilled("batch wait")

        with self.monkeypatch.context() as patch:
            patch.setattr(in_process, "_first_event", killed)
            try:
                self._run(self._conf(profile, embed_mode="batch"))
            except WorkerKilled:
                return f"kill batch waiter (profile {profile})"
        return f"kill batch waiter (profile {profile}): nothing submitted"

    def interleave(self) -> str:
        """A batch-mode run and, while its first task waits for its provider batch, a whole
        other run, as Airflow runs other tasks while one is deferred: the second run's tasks
        meet the first's submission, and may collect its batch before it wakes."""
        outer = self._profile()
        inner = self._profile()
        mode = self.rng.choice(("sync", "batch"))
        first_event = in_process._first_event
        other: dict[str, Any] = {}

        def run_other() -> None:
            context = task_common.get_current_context  # each run sets its own
            try:
                self.runs += 1
                report = dataclasses.replace(self.run, tasks={}, outlets={})(
                    self._conf(inner, embed_mode=mode)
                )
                other["summary"] = self._summary(report)
            finally:
                task_common.get_current_context = context

        async def waiting(trigger: Any) -> Any:
            if not other:
                other["summary"] = "did not end"
                await asyncio.to_thread(run_other)
            return await first_event(trigger)

        self._doing(f"run profile {outer} batch, and profile {inner} {mode} while it waits")
        with self.monkeypatch.context() as patch:
            patch.setattr(in_process, "_first_event", waiting)
            report = self._run(self._conf(outer, embed_mode="batch"))
        self.last_profile = outer
        if not other:
            return f"run profile {outer} batch: {self._summary(report)} (nothing waited)"
        return (
            f"run profile {outer} batch: {self._summary(report)}, and while it waited"
            f" profile {inner} {mode}: {other['summary']}"
        )

    def redrive(self) -> str:
        letters = _rows(
            self.conn,
            "SELECT DISTINCT stage FROM replayable.dead_letters WHERE status = 'open' ORDER BY 1",
        )
        if not letters:
            return "redrive: no open letter"
        stage = self.rng.choice([row[0] for row in letters])
        profile = self._profile()
        redrive = {"stage": stage, "reason": "simulation", "by": "sim"}
        report = self._run({**self._conf(profile, embed_mode="sync"), "redrive": redrive})
        return f"redrive {stage} (profile {profile}): {self._summary(report)}"

    def sweep(self) -> str:
        context = {
            "ti": SimpleNamespace(run_id=f"sweep-{len(self.steps)}"),
            "params": {"max_attempts": MAX_ATTEMPTS, "min_age_minutes": 0, "max_items": 1000},
        }
        with self.monkeypatch.context() as patch:
            patch.setattr(task_common, "get_current_context", lambda: context)
            requests = dag_tasks.sweep()
        for request in requests:
            self._run(dict(request["conf"]))
        return f"sweep: {[r['conf']['rerun']['stage'] for r in requests]}"

    def bump_version(self) -> str:
        self.bumps += 1
        version = f"{extract.VERSION.split('+')[0]}.{self.bumps}"
        self.monkeypatch.setattr(extract, "VERSION", version)
        return f"bump extract to {version}"

    # -- checks ------------------------------------------------------------------------

    def violations(self, *, quiescent: bool) -> list[str]:
        found: list[Violation] = check_ledger(self.conn, quiescent=quiescent, limit=5)
        return [
            f"{v.invariant} {v.stage} {v.doc_id} {v.item_key}: {v.detail}" for v in found
        ] + self.refusal_violations()

    def refusal_violations(self) -> list[str]:
        """What the ledger cannot know and the walk does: which documents hold the refused
        word. A document dead in embed for a refused input must hold one; a clean one is
        dead for another document's input (finding 4 of issue 36)."""
        poisoned = {doc.name for doc in self.docs if doc.poisoned}
        return [
            f"refused_clean embed {doc_id} {item_key}: {Path(uri).name} holds no refused"
            f" input, yet is dead with {error_class}: {(error or '')[:300]}"
            for doc_id, uri, item_key, error_class, error in _rows(self.conn, DEAD_REFUSED)
            if Path(uri).name not in poisoned
        ]

    def provider_violations(self, requests_before: int) -> list[str]:
        """The provider's books: no chunk bought twice per model and dimensions except for an
        answer lost after it was charged; requests bounded by the cap times the lines."""
        stats = self.model.stats()
        lost = stats["lost_embedding_charges"]
        found = [
            f"charged {n} times, {lost.get(key, 0)} of them lost: {key}"
            for key, n in stats["embedding_charges"].items()
            if n - lost.get(key, 0) > 1
        ]
        # Each line (a request) holds at least one chunk, and a run tries it at most the cap
        # times, each try making at most CallRetry's calls.
        chunks = len(self._all_chunk_texts())
        bound = CallRetry().max_attempts * MAX_ATTEMPTS * max(chunks, 1) * max(self.runs, 1)
        sent = stats["by_endpoint"]["embeddings"] - requests_before
        if sent > bound:
            found.append(
                f"{sent} embeddings requests in {self.runs} run(s), over the bound {bound}"
            )
        return found

    def drain(self) -> None:
        """Clear the harm, then run the last settings until nothing is left to do.

        Each document's current items are those of the last settings it was run with; a run
        of the last settings over every document makes them all that run's.
        """
        self._set_faults("off")
        time.sleep(BASE_CONF["lease_s"])  # killed workers' leases end
        for _ in range(DRAIN_ROUNDS):
            self._run(self._conf(self.last_profile, embed_mode="sync"))
            if not count_violations(self.conn, quiescent=True)["no_outcome"]:
                return

    # -- helpers -----------------------------------------------------------------------

    def _doing(self, what: str) -> None:
        """Name the step before it runs, so that a step that never ends is named too."""
        name = self.steps[-1].split(":", 1)[0]
        self.steps[-1] = f"{name}: {what} (did not end)"

    def _profile(self) -> int:
        """A drawn settings profile; the last one while a letter is open and 11b is known."""
        drawn = self.rng.randrange(len(PROFILES))
        if "11b" in KNOWN_HOLES and _rows(
            self.conn, "SELECT 1 FROM replayable.dead_letters WHERE status = 'open' LIMIT 1"
        ):
            return self.last_profile
        return drawn

    def _conf(self, profile: int, **extra: Any) -> dict[str, Any]:
        self.last_profile = profile
        return {
            **BASE_CONF,
            **PROFILES[profile],
            "source": str(self.folder),
            "max_attempts": MAX_ATTEMPTS,
            **extra,
        }

    def _run(self, conf: dict[str, Any]) -> dict[str, Any]:
        self.runs += 1
        deferrals = 0
        first_event = in_process._first_event

        async def bounded(trigger: Any) -> Any:
            nonlocal deferrals
            deferrals += 1
            if deferrals > MAX_DEFERRALS_PER_RUN:
                batches = self.model.stats()["batches_created"]
                raise Runaway(
                    f"a run deferred {deferrals} times for provider batches and never ended"
                    f" ({batches} batches created since the walk began)"
                )
            return await first_event(trigger)

        with self.monkeypatch.context() as patch:
            patch.setattr(in_process, "_first_event", bounded)
            return self.run(conf)

    def _set_faults(self, harm: str) -> None:
        self.harm = harm
        self.model.set_faults({**BASE_FAULTS, "seed": self.rng.randrange(2**31), **HARMS[harm]})

    def _paragraph(self, poisoned: bool) -> str:
        words = [self.rng.choice(WORDS) for _ in range(self.rng.randint(20, 90))]
        if poisoned:
            words.insert(self.rng.randrange(len(words)), POISON)
        return f"Document {len(self.docs)}: " + " ".join(words) + "."

    def _write(self, parts: list[str], poisoned: bool, salt: str = "") -> str:
        name = f"doc-{len(self.docs):03d}.pdf"
        data = corpus.pdf_bytes(parts)
        if salt:  # a comment after the end: other bytes, the same text
            data += f"\n% {salt}\n".encode()
        (self.folder / name).write_bytes(data)
        self.docs.append(Doc(name, parts, poisoned))
        return f"add {name}{' (poisoned)' if poisoned else ''}"

    def _all_chunk_texts(self) -> list[str]:
        return [row[0] for row in _rows(self.conn, "SELECT text FROM replayable.chunks")]

    @staticmethod
    def _summary(report: dict[str, Any]) -> str:
        stages = report.get("stages") or {}
        parts = [
            f"{name} " + "/".join(str(counts.get(s, 0)) for s in ("done", "failed", "dead"))
            for name, counts in stages.items()
        ]
        return ", ".join(parts) or "nothing to do"


# Each rule with its weight; rules that walk into a known hole are left out (KNOWN_HOLES).
RULES: dict[str, tuple[int, Callable[[Walk], str], str | None]] = {
    "add_new": (3, Walk.add_new, None),
    "add_copy": (2, Walk.add_copy, None),
    "add_boilerplate": (2, Walk.add_boilerplate, None),
    "run_stage": (6, Walk.run_stage, None),
    "harm_provider": (3, Walk.harm_provider, None),
    "kill_worker": (1, Walk.kill_worker, None),
    "kill_batch_waiter": (1, Walk.kill_batch_waiter, "3"),
    "interleave": (2, Walk.interleave, None),
    "redrive": (1, Walk.redrive, None),
    "sweep": (1, Walk.sweep, None),
    "bump_version": (1, Walk.bump_version, "11"),
}


def enabled_rules() -> list[tuple[str, int]]:
    return [
        (name, weight)
        for name, (weight, _, hole) in RULES.items()
        if hole is None or hole not in KNOWN_HOLES
    ]


def walk(walker: Walk, steps: int) -> None:
    """Take ``steps`` drawn steps, checking after each, then drain and check at quiescence."""
    rules = enabled_rules()
    names = [name for name, _ in rules]
    weights = [weight for _, weight in rules]
    for _ in range(steps):
        name = walker.rng.choices(names, weights)[0]
        before = walker.model.stats()["by_endpoint"]["embeddings"]
        walker.runs = 0
        walker.steps.append(f"{name}: ...")
        try:
            walker.steps[-1] = f"{name}: {RULES[name][1](walker)}"
        except Runaway as error:
            _fail_on(walker, [str(error)])
        except Exception as error:  # the seed and steps are worth more than the traceback
            _fail_on(walker, [f"the step raised {error!r}:\n{traceback.format_exc()}"])
        _fail_on(walker, walker.violations(quiescent=False) + walker.provider_violations(before))
    before = walker.model.stats()["by_endpoint"]["embeddings"]
    walker.runs = 0
    walker.steps.append("drain")
    try:
        walker.drain()
    except Runaway as error:
        _fail_on(walker, [str(error)])
    except Exception as error:
        _fail_on(walker, [f"the drain raised {error!r}:\n{traceback.format_exc()}"])
    _fail_on(walker, walker.violations(quiescent=True) + walker.provider_violations(before))
    stats = walker.model.stats()
    twice = sum(1 for n in stats["embedding_charges"].values() if n > 1)
    print(  # shown with -s: the walk, and the inputs bought twice (each for a lost answer)
        f"simulation seed {walker.seed}, {steps} steps, {twice} input(s) charged more than"
        f" once, {stats['lost_responses']} answer(s) lost:\n{_listing(walker)}"
    )


def _listing(walker: Walk) -> str:
    return "\n".join(f"  {n:3d}. {step}" for n, step in enumerate(walker.steps, 1))


def _fail_on(walker: Walk, found: list[str]) -> None:
    if not found:
        return
    steps = _listing(walker)
    broken = "\n".join(f"  - {line}" for line in found[:20])
    more = f"\n  ... and {len(found) - 20} more" if len(found) > 20 else ""
    taken = sum(1 for step in walker.steps if not step.startswith(("start:", "drain")))
    holes = ""
    if KNOWN_HOLES_ENV in os.environ:  # the walk's rules are not this branch's default
        holes = f"{KNOWN_HOLES_ENV}={','.join(sorted(KNOWN_HOLES))} "
    pytest.fail(
        f"simulation seed {walker.seed} broke an invariant at step {len(walker.steps)}"
        f" (reproduce: {holes}make simulate SEED={walker.seed} STEPS={taken}):\n"
        f"{broken}{more}\nsteps:\n{steps}",
        pytrace=False,
    )


def _rows(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql)
        found = cur.fetchall()
    conn.commit()
    return found
