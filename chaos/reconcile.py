"""The reconciliation a scenario ends with: counted from the ledger and the provider, then checked.

Per run and stage, over the run's documents: items in, and how many ended done, failed,
dead or neither (``other``: running or pending, which must be 0), so that
``in = done + failed + dead``. Then, over the database: no output key stored twice, every
done item has its outputs, every dead item has an open dead letter carrying its class, its
message and a full traceback, and the dead items are exactly the poison with the class each
one must end with. From the provider: with its de-duplication on, no chunk charged more
than once; with it off (a provider that charges every request, as real ones do), every
chunk charged more than once is an answer the provider charged and no task stored, and
those lost answers are no more than the scenario's fault can lose (ADR 0082).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos.documents import Corpus
from chaos.env import MODEL, ChaosEnv

STAGES = ("extract", "chunk", "embed")

STAGE_COUNTS = """
SELECT s.stage, s.status, count(*)
FROM replayable.run_docs r
JOIN replayable.stage_runs s ON s.doc_id = r.doc_id AND s.is_current
WHERE r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s
GROUP BY 1, 2
"""
RUN_DOCUMENTS = """
SELECT count(*) FROM replayable.run_docs WHERE dag_id = %(dag_id)s AND run_id = %(run_id)s
"""
DEAD_ITEMS = """
SELECT d.uri, s.stage, s.error_class
FROM replayable.run_docs r
JOIN replayable.stage_runs s ON s.doc_id = r.doc_id AND s.is_current AND s.status = 'dead'
JOIN replayable.documents d ON d.doc_id = r.doc_id
WHERE r.dag_id = %(dag_id)s AND r.run_id = %(run_id)s
"""
# Each output table's key: a key stored twice is a duplicate output.
DUPLICATE_KEYS = {
    "extractions": """SELECT count(*) FROM (SELECT 1 FROM replayable.extractions
        GROUP BY doc_id, extractor_version HAVING count(*) > 1) d""",
    "chunks": """SELECT count(*) FROM (SELECT 1 FROM replayable.chunks
        GROUP BY chunk_id HAVING count(*) > 1) d""",
    "doc_chunks": """SELECT count(*) FROM (SELECT 1 FROM replayable.doc_chunks
        GROUP BY doc_id, extractor_version, chunker_key, ordinal HAVING count(*) > 1) d""",
    "embeddings": """SELECT count(*) FROM (SELECT 1 FROM replayable.embeddings
        GROUP BY chunk_id, model, dimensions HAVING count(*) > 1) d""",
    "open dead letters": """SELECT count(*) FROM (SELECT 1 FROM replayable.dead_letters
        WHERE status = 'open' GROUP BY stage, item_key HAVING count(*) > 1) d""",
    "current stage rows": """SELECT count(*) FROM (SELECT 1 FROM replayable.stage_runs
        WHERE is_current GROUP BY stage, doc_id HAVING count(*) > 1) d""",
}
# Done items whose outputs are not all there.
MISSING_OUTPUTS = {
    "extract": """SELECT count(*) FROM replayable.stage_runs s
        WHERE s.stage = 'extract' AND s.is_current AND s.status = 'done'
          AND NOT EXISTS (SELECT 1 FROM replayable.extractions e
                          WHERE e.doc_id = s.doc_id
                            AND split_part(e.extractor_version, '+', 1) = s.code_version)""",
    "chunk": """SELECT count(*) FROM replayable.stage_runs s
        WHERE s.stage = 'chunk' AND s.is_current AND s.status = 'done'
          AND NOT EXISTS (SELECT 1 FROM replayable.doc_chunks c WHERE c.doc_id = s.doc_id
                          GROUP BY c.chunker_key
                          HAVING max(c.ordinal) + 1 = count(*))""",
    "embed": """SELECT count(*) FROM replayable.stage_runs s
        WHERE s.stage = 'embed' AND s.is_current AND s.status = 'done'
          AND EXISTS (SELECT 1 FROM replayable.doc_chunks c
                      WHERE c.doc_id = s.doc_id AND NOT EXISTS (
                          SELECT 1 FROM replayable.embeddings e
                          WHERE e.chunk_id = c.chunk_id AND e.model = %(model)s))""",
}
# Dead items without an open letter that carries their class, message and full traceback. An
# item whose task was killed under it (`killed`) has no traceback: nothing raised, the
# process died; its letter names the last task that held it and that task's try instead.
INCOMPLETE_LETTERS = """
SELECT count(*) FROM replayable.stage_runs s
WHERE s.is_current AND s.status = 'dead' AND NOT EXISTS (
    SELECT 1 FROM replayable.dead_letters d
    WHERE d.stage = s.stage AND d.item_key = s.item_key AND d.status = 'open'
      AND d.error_class = s.error_class AND d.error_class <> '' AND d.error <> ''
      AND CASE WHEN d.error_class = 'killed'
               THEN d.error LIKE '%%last held by %%' AND d.try_number IS NOT NULL
               ELSE d.traceback LIKE '%%Traceback (most recent call last)%%' END)
"""
DEAD_LETTERS = "SELECT count(*) FROM replayable.dead_letters WHERE status = 'open'"
PAID_INPUTS = """
SELECT coalesce(sum(n_inputs), 0) FROM replayable.model_calls WHERE status = 'ok'
"""
PAID_REQUESTS = "SELECT count(*) FROM replayable.model_calls WHERE status = 'ok'"
EMBEDDINGS = "SELECT count(*) FROM replayable.embeddings WHERE model = %(model)s"


@dataclass
class StageRow:
    stage: str
    entered: int
    done: int
    failed: int
    dead: int
    other: int
    expected_in: int

    @property
    def balanced(self) -> bool:
        return self.other == 0 and self.entered == self.done + self.failed + self.dead


@dataclass
class RunTable:
    run_id: str
    documents: int
    state: str
    clears: int
    stages: list[StageRow]


@dataclass
class Reconciliation:
    """Every count a scenario is judged on, and the checks that failed (empty: it passed)."""

    runs: list[RunTable]
    duplicate_keys: dict[str, int]
    missing_outputs: dict[str, int]
    dead_letters: int
    incomplete_letters: int
    unexpected_dead: list[str]
    missing_dead: list[str]
    embeddings: int
    paid_inputs_recorded: int
    provider: dict[str, Any]
    dedupe: bool
    # Answers the provider gave (charged or replayed) that no task stored: requests, inputs.
    lost_answers: int = 0
    lost_inputs: int = 0
    # The most answers the scenario's fault can lose (None: not judged).
    lost_allowed: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data


def provider_summary(stats: dict[str, Any]) -> dict[str, Any]:
    """What the provider says was charged: per input (chunk) and per idempotency key."""
    counts = stats["input_success_counts"].values()
    keys = stats["idempotency_keys"].values()
    return {
        "requests": stats["requests"],
        "charged": stats["charged"],
        "deduplicated": stats["deduplicated"],
        "failed": stats["failed"],
        "lost_responses": stats["lost_responses"],
        "by_status": stats["by_status"],
        "peak_in_flight": stats["peak_in_flight"],
        "inputs_charged": stats["inputs_embedded"],
        "chunks_charged": len(stats["input_success_counts"]),
        "chunks_charged_more_than_once": sum(1 for n in counts if n > 1),
        "extra_chunk_charges": sum(n - 1 for n in counts if n > 1),
        "would_deduplicate": stats["would_deduplicate"],
        "keys_charged_more_than_once": sum(1 for n in keys if n > 1),
        "extra_key_charges": sum(n - 1 for n in keys if n > 1),
    }


def reconcile(
    env: ChaosEnv,
    runs: list[tuple[str, str, int, Corpus]],
    stats: dict[str, Any],
    *,
    dedupe: bool = True,
    lost_allowed: int | None = None,
) -> Reconciliation:
    """Count and check ``runs`` (run id, final state, clears, corpus) after they ended.

    :param lost_allowed: the most provider answers the scenario's fault can lose (requests
        in flight at a kill, responses dropped, requests given up at the deadline).
    """
    tables = []
    expected_dead: set[tuple[str, str, str]] = set()
    found_dead: set[tuple[str, str, str]] = set()
    for run_id, state, clears, corpus in runs:
        params = {"dag_id": "document_pipeline", "run_id": run_id}
        counts: Counter[tuple[str, str]] = Counter()
        for stage, status, n in env.query(STAGE_COUNTS, params):
            counts[(stage, status)] += n
        documents = env.scalar(RUN_DOCUMENTS, params)
        rows = []
        expected_in = documents
        for stage in STAGES:
            done, failed, dead = (counts[(stage, s)] for s in ("done", "failed", "dead"))
            other = counts[(stage, "running")] + counts[(stage, "pending")]
            entered = done + failed + dead + other
            rows.append(StageRow(stage, entered, done, failed, dead, other, expected_in))
            expected_in = done
        tables.append(RunTable(run_id, documents, state, clears, rows))
        expected_dead |= {(p.path.name, p.stage, p.error_class) for p in corpus.poison}
        found_dead |= {
            (Path(uri).name, stage, error_class)
            for uri, stage, error_class in env.query(DEAD_ITEMS, params)
        }
    provider = provider_summary(stats)
    result = Reconciliation(
        runs=tables,
        duplicate_keys={name: env.scalar(sql) for name, sql in DUPLICATE_KEYS.items()},
        missing_outputs={
            stage: env.scalar(sql, {"model": MODEL}) for stage, sql in MISSING_OUTPUTS.items()
        },
        dead_letters=env.scalar(DEAD_LETTERS),
        incomplete_letters=env.scalar(INCOMPLETE_LETTERS),
        unexpected_dead=sorted(" ".join(d) for d in found_dead - expected_dead),
        missing_dead=sorted(" ".join(d) for d in expected_dead - found_dead),
        embeddings=env.scalar(EMBEDDINGS, {"model": MODEL}),
        paid_inputs_recorded=env.scalar(PAID_INPUTS),
        provider=provider,
        dedupe=dedupe,
        lost_allowed=lost_allowed,
    )
    answered = provider["charged"] + provider["deduplicated"]
    result.lost_answers = max(0, answered - env.scalar(PAID_REQUESTS))
    result.lost_inputs = max(0, provider["inputs_charged"] - result.paid_inputs_recorded)
    result.problems = _problems(result, runs)
    return result


def _problems(r: Reconciliation, runs: list[tuple[str, str, int, Corpus]]) -> list[str]:
    problems = []
    for table, (_, _, _, corpus) in zip(r.runs, runs, strict=True):
        name = f"run {table.run_id}"
        if table.state != "success":
            problems.append(f"{name} ended {table.state} after {table.clears} clear(s)")
        if table.clears > 1:
            problems.append(f"{name} needed {table.clears} clears (at most one is allowed)")
        if table.documents != corpus.documents:
            problems.append(f"{name} has {table.documents} documents, not {corpus.documents}")
        for row in table.stages:
            if not row.balanced:
                problems.append(
                    f"{name} {row.stage}: in {row.entered} != done {row.done} + failed "
                    f"{row.failed} + dead {row.dead} ({row.other} running or pending)"
                )
            if row.entered != row.expected_in:
                problems.append(
                    f"{name} {row.stage}: {row.entered} entered, {row.expected_in} expected"
                )
            if row.failed:
                problems.append(f"{name} {row.stage}: {row.failed} left failed")
        if table.stages[-1].done != len(corpus.clean):
            problems.append(
                f"{name}: {table.stages[-1].done} documents embedded, {len(corpus.clean)} expected"
            )
    for what, counts in (("duplicate", r.duplicate_keys), ("missing", r.missing_outputs)):
        for name, n in counts.items():
            if n:
                problems.append(f"{n} {what} output key(s) in {name}")
    if r.incomplete_letters:
        problems.append(f"{r.incomplete_letters} dead item(s) without a complete dead letter")
    if r.unexpected_dead:
        problems.append(f"dead but not poison: {r.unexpected_dead}")
    if r.missing_dead:
        problems.append(f"poison not dead with its class: {r.missing_dead}")
    if r.paid_inputs_recorded != r.embeddings:
        problems.append(
            f"{r.paid_inputs_recorded} paid inputs recorded for {r.embeddings} embeddings"
        )
    p = r.provider
    if r.dedupe:
        if p["chunks_charged_more_than_once"]:
            problems.append(f"{p['chunks_charged_more_than_once']} chunk(s) charged more than once")
        if p["inputs_charged"] != r.embeddings:
            problems.append(f"{p['inputs_charged']} inputs charged for {r.embeddings} embeddings")
    else:
        if p["extra_key_charges"] != p["would_deduplicate"]:
            problems.append(
                f"{p['extra_key_charges']} repeated charges under one key, but the provider "
                f"counts {p['would_deduplicate']} it would have de-duplicated"
            )
        # The physical minimum: a chunk is bought again only when an answer the provider
        # charged for it never reached the ledger.
        if p["extra_chunk_charges"] > r.lost_inputs:
            problems.append(
                f"{p['extra_chunk_charges']} extra chunk charges, but only {r.lost_inputs} "
                "charged inputs were lost: chunks were paid twice with both answers kept"
            )
    if r.lost_allowed is not None and r.lost_answers > r.lost_allowed:
        problems.append(
            f"{r.lost_answers} charged answers never stored, more than the {r.lost_allowed} "
            "the fault can lose"
        )
    return problems


def format_table(r: Reconciliation) -> str:
    """The reconciliation as a fixed-width table a person reads at a glance."""
    lines = []
    for table in r.runs:
        cleared = f", {table.clears} clear" if table.clears else ""
        lines.append(f"run {table.run_id}: {table.documents} documents, {table.state}{cleared}")
        lines.append(
            f"  {'stage':<8}{'in':>6}{'done':>6}{'failed':>8}{'dead':>6}{'other':>7}  in = d+f+d"
        )
        for row in table.stages:
            mark = "yes" if row.balanced else "NO"
            lines.append(
                f"  {row.stage:<8}{row.entered:>6}{row.done:>6}{row.failed:>8}{row.dead:>6}"
                f"{row.other:>7}  {mark}"
            )
    duplicates = sum(r.duplicate_keys.values())
    missing = sum(r.missing_outputs.values())
    p = r.provider
    lines += [
        f"duplicate output keys: {duplicates}; done items missing outputs: {missing}",
        f"dead letters: {r.dead_letters} open, {r.incomplete_letters} without class/error/"
        f"traceback; unexpected dead: {len(r.unexpected_dead)}; poison not dead: "
        f"{len(r.missing_dead)}",
        f"embeddings: {r.embeddings}; paid inputs recorded: {r.paid_inputs_recorded}",
        f"provider ({'de-duplication on' if r.dedupe else 'de-duplication OFF'}): "
        f"{p['requests']} requests, {p['charged']} charged, {p['deduplicated']} de-duplicated, "
        f"{p['lost_responses']} responses lost; chunks charged more than once: "
        f"{p['chunks_charged_more_than_once']}; would de-duplicate: {p['would_deduplicate']}",
        f"charged answers never stored: {r.lost_answers} requests, {r.lost_inputs} inputs "
        f"(the fault can lose {'-' if r.lost_allowed is None else r.lost_allowed}); "
        f"peak requests in flight: {p['peak_in_flight']}",
    ]
    return "\n".join(lines)
