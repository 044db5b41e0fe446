"""The ledger's invariants, checked on any ledger: ``replayable check`` (ADR 0150).

Each check is one set-based query in ``sql/queries/check/`` that reads the ledger alone (no
provider's books) and returns the rows that break it, each with its stage, document and
item. :func:`check_ledger` runs them all; :func:`run_check` also says how many rows break
each invariant in all and which items are in flight. Nothing here writes, except
:func:`record_counts`, which keeps the last counts for the metrics endpoint.

Outputs are checked under what a done row's hashes name: its ``config_hash`` its own
settings (the engine; size and overlap; model and dimensions), its ``spec_hash`` the stages
it read (the extractor; the chunker). A hash cannot be read backwards, so every value the
ledger's outputs can carry is hashed forwards, as the stages hash theirs (:class:`Lineages`):
the engines, the code versions of current rows, the (extractor, chunker) pairs of the
stored chunks, the models and dimensions of the stored vectors (ADR 0151). A config hash that
matches none names outputs stored nowhere; a spec hash that matches none was written by an
older release, and its row gets a weaker check: some output under its code version.

``check_ledger(conn, quiescent=True)`` is what a test or a chaos scenario calls once the
ledger has settled; ADR 0150 lists the invariants and why each query is shaped as it is.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg2.extensions

from replayable.db import Connection, execute, fetch_all
from replayable.keys import config_hash
from replayable.runner import spec_hash_of
from replayable.stages import embed, extract
from replayable.stages.chunk.chunker import ChunkConfig
from replayable.stages.lineage import chunk_lineage, embed_lineage

# The invariants, in the order they are checked and listed. At quiescence (no run, sweep or
# redrive in progress) ``no_outcome`` applies as well: every current item is done or dead.
INVARIANTS = (
    "one_current_item",
    "done_with_open_letter",
    "dead_without_letter",
    "one_open_letter",
    "done_without_output",
    "claim_without_submission",
    "counters_equal_ledger",
    "report_equals_ledger",
    "no_outcome",
)
# Provider submissions that may hold chunk claims; any other status has released them.
LIVE_SUBMISSIONS = ("submitting", "waiting")
# Statuses that are no outcome: none of them may remain at quiescence.
NO_OUTCOME = ("pending", "running", "failed")
# The report's statuses compared with the ledger's at quiescence.
REPORT_STATUSES = ("done", "failed", "dead", "running", "pending")
# Memory for each hash of the check (its transaction only): a million documents' keys fit.
WORK_MEM = "256MB"
# Artifact stages known without looking: the shipped one. Others are found in item_artifacts.
ARTIFACT_STAGES = ("summarize",)
_CHUNKER_KEY = re.compile(r"^v(?P<version>.+)-s(?P<size>\d+)-o(?P<overlap>\d+)$")


@dataclass(frozen=True)
class Violation:
    """One row of the ledger that breaks one invariant."""

    invariant: str
    stage: str | None
    doc_id: str | None
    item_key: str | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CheckResult:
    """What a check found: violations (at most ``limit`` per invariant), and how many in all.

    ``in_flight`` lists running items whose lease has expired: a worker is gone and a claim
    will take them over. They break nothing until the ledger is quiescent, when they are
    ``no_outcome`` violations instead.
    """

    quiescent: bool
    violations: list[Violation] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)
    in_flight: list[Violation] = field(default_factory=list)
    in_flight_total: int = 0

    @property
    def clean(self) -> bool:
        return not any(self.totals.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "quiescent": self.quiescent,
            "clean": self.clean,
            "totals": dict(self.totals),
            "violations": [v.as_dict() for v in self.violations],
            "in_flight_total": self.in_flight_total,
            "in_flight": [v.as_dict() for v in self.in_flight],
        }


def check_ledger(
    conn: Connection, *, quiescent: bool = False, limit: int | None = None
) -> list[Violation]:
    """Every violation of the ledger's invariants (at most ``limit`` per invariant).

    :param quiescent: no run, sweep or redrive is in progress: every current item must then
        be done or dead, and the newest report must still equal the ledger.
    :param limit: rows listed per invariant; None lists them all.
    """
    return run_check(conn, quiescent=quiescent, limit=limit).violations


def count_violations(conn: Connection, *, quiescent: bool = False) -> dict[str, int]:
    """Violations per invariant (every invariant named, zeros included)."""
    return run_check(conn, quiescent=quiescent, limit=0).totals


def run_check(
    conn: Connection,
    *,
    quiescent: bool = False,
    limit: int | None = None,
    timeout_s: float | None = None,
) -> CheckResult:
    """Run every check in a read-only snapshot; see :class:`CheckResult`.

    On a connection already in a transaction the checks run in it, and nothing is undone.

    :param timeout_s: how long each statement may take (for the check's transaction only);
        None keeps the session's statement timeout.
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be at least 0, got {limit}")
    result = CheckResult(quiescent=quiescent, totals=dict.fromkeys(INVARIANTS, 0))
    if not quiescent:
        del result.totals["no_outcome"]
    if conn.status == psycopg2.extensions.STATUS_IN_TRANSACTION:
        _run(conn, result, limit, timeout_s)  # the caller's transaction: nothing is undone
        return result
    restore = conn.autocommit
    conn.autocommit = False
    try:
        # One snapshot for every query, so that no check sees a transition another missed.
        execute(conn, "check/snapshot")
        _run(conn, result, limit, timeout_s)
    finally:
        conn.rollback()
        conn.autocommit = restore
    return result


def _run(conn: Connection, result: CheckResult, limit: int | None, timeout_s: float | None) -> None:
    ms = None if timeout_s is None else str(max(1, round(timeout_s * 1000)))
    fetch_all(conn, "check/budget", {"work_mem": WORK_MEM, "ms": ms})
    # Each query lists at least one row, whose window count is the invariant's total.
    base = {"limit": None if limit is None else max(limit, 1)}
    lineages = Lineages.of_ledger(conn)
    stages = {"stages": lineages.stages}
    plain = [
        ("one_current_item", "check/current_items", base),
        ("done_with_open_letter", "check/done_with_open_letter", base),
        ("dead_without_letter", "check/dead_without_letter", {**base, **stages}),
        ("one_open_letter", "check/open_letters", base),
        ("claim_without_submission", "check/live_claims", {**base, "live": list(LIVE_SUBMISSIONS)}),
        ("counters_equal_ledger", "check/counters", base),
        ("report_equals_ledger", "check/report_balance", base),
    ]
    outputs = [
        ("check/extract_outputs", {**base, **lineages.extract_params()}),
        ("check/chunk_outputs", {**base, **lineages.chunk_params()}),
        ("check/embed_outputs", {**base, **lineages.embed_params()}),
        ("check/artifact_outputs", {**base, "stages": artifact_stages(conn)}),
    ]
    for invariant, query, params in plain:
        _add(result, invariant, fetch_all(conn, query, params), limit)
    for query, params in outputs:
        _add(result, "done_without_output", fetch_all(conn, query, params), limit)
    # Before quiescence only a running item under an expired lease is worth naming.
    statuses = list(NO_OUTCOME) if result.quiescent else ["running"]
    outcome = {**base, **stages, "statuses": statuses, "stale_only": not result.quiescent}
    rows = fetch_all(conn, "check/no_outcome", outcome)
    if result.quiescent:
        _add(result, "no_outcome", rows, limit)
        extra = newest_report_violations(conn)
        result.totals["report_equals_ledger"] += len(extra)
        result.violations.extend(extra[:limit])
    else:
        result.in_flight = [_violation("no_outcome", row) for row in rows[:limit]]
        result.in_flight_total = int(rows[0]["total"]) if rows else 0
    result.violations.sort(key=lambda v: INVARIANTS.index(v.invariant))


def _add(
    result: CheckResult, invariant: str, rows: list[dict[str, Any]], limit: int | None
) -> None:
    result.violations.extend(_violation(invariant, row) for row in rows[:limit])
    result.totals[invariant] += int(rows[0]["total"]) if rows else 0


def _violation(invariant: str, row: Mapping[str, Any]) -> Violation:
    return Violation(invariant, row["stage"], row["doc_id"], row["item_key"], row["detail"])


def artifact_stages(conn: Connection) -> list[str]:
    """The shipped artifact stage and every stage that has linked an artifact."""
    found = {row["stage"] for row in fetch_all(conn, "check/artifact_stages")}
    return sorted(found.union(ARTIFACT_STAGES))


def newest_report_violations(conn: Connection) -> list[Violation]:
    """At quiescence the newest saved report counts what the ledger holds for its run: per
    stage and status, its documents' current items (report/stage_status, by run), unless an
    item of those documents changed after the report was saved (a later step without a
    report of its own)."""
    newest = fetch_all(conn, "check/newest_report")
    if not newest or newest[0]["changed_since"]:
        return []  # no report, or one of a ledger that has changed since
    dag_id, run_id, report = newest[0]["dag_id"], newest[0]["run_id"], newest[0]["report"]
    stages = dict(report.get("stages") or {})
    params = {"dag_id": dag_id, "run_id": run_id, "stages": sorted(stages)}
    ledger: Counter[tuple[str, str]] = Counter()
    for row in fetch_all(conn, "report/stage_status", params):
        ledger[row["stage"], row["status"]] += int(row["n"])
    found = []
    for stage, counts in sorted(stages.items()):
        for status in REPORT_STATUSES:
            said, holds = int(counts.get(status, 0)), ledger[stage, status]
            if said != holds:
                detail = (
                    f"run {run_id} of {dag_id}: its report says {said} {status}, "
                    f"the ledger holds {holds}"
                )
                found.append(Violation("report_equals_ledger", stage, None, None, detail))
    return found


@dataclass
class Lineages:
    """What the hashes on done rows of the shipped stages name, hashed forwards.

    A config hash names a stage's own settings (extract: the engine; chunk: size and
    overlap; embed: model and dimensions), a spec hash the stages it reads (chunk: the
    extractor; embed: the extractor and chunker). Each map holds every value the ledger's
    outputs could match; a hash missing from one names outputs stored nowhere.
    """

    engines: dict[str, str] = field(default_factory=dict)  # config hash -> engine policy
    shapes: dict[str, str] = field(default_factory=dict)  # config hash -> "s800-o100"
    chunk_reads: dict[str, str] = field(default_factory=dict)  # spec hash -> extractor
    sizes: dict[str, tuple[str, int]] = field(default_factory=dict)  # -> model, dimensions
    embed_reads: dict[str, tuple[str, str]] = field(default_factory=dict)  # -> extractor, chunker
    stages: list[str] = field(default_factory=list)  # every stage with current rows

    @classmethod
    def of_ledger(cls, conn: Connection) -> Lineages:
        versions: dict[str, set[str]] = {}
        models: set[tuple[str, int]] = set()
        for row in fetch_all(conn, "check/lineage_sources"):
            if row["kind"] == "version":
                versions.setdefault(row["a"], set()).add(row["b"])
            else:
                models.add((row["a"], int(row["dimensions"])))
        chunkings = [
            (row["extractor_version"], row["chunker_key"])
            for row in fetch_all(conn, "check/chunkings")
        ]
        found = cls.of(versions, chunkings, models)
        found.stages = sorted(versions)
        return found

    @classmethod
    def of(
        cls,
        versions: Mapping[str, Iterable[str]],
        chunkings: Iterable[tuple[str, str]],
        models: Iterable[tuple[str, int]],
    ) -> Lineages:
        """Hash every combination of the parts found, as the stages do (stages.lineage);
        ``models`` are (model, dimensions) as stored, 0 for the model's own size."""
        found = cls()
        found.engines = {config_hash({"engine": e}): e for e in extract.ENGINES}
        pairs = sorted(set(chunkings))
        for extractor, chunker in pairs:
            parts = _CHUNKER_KEY.match(chunker)
            if parts is None:
                continue
            size, overlap = int(parts["size"]), int(parts["overlap"])
            found.shapes[config_hash({"size": size, "overlap": overlap})] = f"s{size}-o{overlap}"
            if parts["version"] not in versions.get("chunk", ()):
                continue
            try:
                shape = ChunkConfig(size, overlap)
            except ValueError:  # no chunker of this release writes such a key
                continue
            lineage = chunk_lineage(shape, extractor)
            found.chunk_reads[spec_hash_of("chunk", parts["version"], lineage)] = extractor
        # An identity stored names the dimensions its items asked for (ADR 0151).
        sizes = [(model, stored, stored or None) for model, stored in sorted(set(models))]
        for model, stored, dims in sizes:
            found.sizes[config_hash(embed.key_config(model, dims))] = (model, stored)
        for version in versions.get("embed", ()):
            for extractor, chunker in pairs:
                for model, _, dims in sizes:
                    lineage = embed_lineage(model, dims, chunker, extractor)
                    key = spec_hash_of("embed", version, lineage)
                    found.embed_reads[key] = (extractor, chunker)
        return found

    def extract_params(self) -> dict[str, Any]:
        return {"config_hashes": list(self.engines), "engines": list(self.engines.values())}

    def chunk_params(self) -> dict[str, Any]:
        return {
            "config_hashes": list(self.shapes),
            "shapes": list(self.shapes.values()),
            "spec_hashes": list(self.chunk_reads),
            "extractors": list(self.chunk_reads.values()),
        }

    def embed_params(self) -> dict[str, Any]:
        sizes, reads = list(self.sizes.values()), list(self.embed_reads.values())
        return {
            "config_hashes": list(self.sizes),
            "models": [model for model, _ in sizes],
            "dimensions": [dims for _, dims in sizes],
            "spec_hashes": list(self.embed_reads),
            "extractors": [extractor for extractor, _ in reads],
            "chunkers": [chunker for _, chunker in reads],
        }


def record_counts(conn: Connection, totals: Mapping[str, int], *, quiescent: bool) -> None:
    """Keep ``totals`` as the last check's counts, for the metrics endpoint, and commit."""
    names = sorted(totals)
    execute(
        conn,
        "check/record_counts",
        {
            "invariants": names,
            "violations": [int(totals[name]) for name in names],
            "quiescent": quiescent,
        },
    )
    conn.commit()


def recorded_counts(conn: Connection) -> list[dict[str, Any]]:
    """The counts the last :func:`record_counts` kept, per invariant, with their time
    (``checked_at``, Unix seconds): what the metrics endpoint reports."""
    return fetch_all(conn, "check/recorded_counts")
