"""Shared pieces of the benchmarks: samples and their spread, result rows, services, data.

Every figure a benchmark reports is a ratio against a baseline measured in the same run on
the same machine, so a slow or busy machine shifts both sides alike; seconds are printed
for context only and are never compared with a fixed number.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.extensions

from devtools import devenv
from devtools.model_server import LocalModelServer
from replayable import db
from replayable.keys import sha256_bytes

ROOT = Path(__file__).resolve().parents[1]

# Everything a stage writes; documents and extractions (the inputs) are kept.
STAGE_TABLES = (
    "model_calls",
    "embeddings",
    "doc_chunks",
    "chunks",
    "dead_letters",
    "stage_runs",
    "run_reports",
)


# --- samples and results ------------------------------------------------------------


class BenchError(RuntimeError):
    """A benchmark's own precondition failed, so its figures would mean nothing."""


@dataclass(frozen=True)
class Samples:
    """Repeated measurements of one quantity; the median is the figure, min to max the spread."""

    values: tuple[float, ...]
    unit: str = "s"

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread_pct(self) -> float:
        """(max - min) / median, in percent: how far apart the repeats landed."""
        if self.median == 0:
            return 0.0
        return 100 * (max(self.values) - min(self.values)) / self.median

    def describe(self) -> str:
        if self.unit == "s":
            return (
                f"median {fmt_seconds(self.median)} over {len(self.values)} runs "
                f"(min {fmt_seconds(min(self.values))}, max {fmt_seconds(max(self.values))}, "
                f"spread {self.spread_pct:.0f}%)"
            )
        return f"{self.median:g} {self.unit} (n={len(self.values)})"

    def short(self) -> str:
        if self.unit == "s":
            return f"{fmt_seconds(self.median)} ±{self.spread_pct / 2:.0f}%"
        return f"{self.median:g} {self.unit}"

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "median": self.median,
            "min": min(self.values),
            "max": max(self.values),
            "spread_pct": round(self.spread_pct, 1),
            "values": list(self.values),
        }


def fmt_seconds(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Return (seconds, result) of one call of ``fn``."""
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


@dataclass(frozen=True)
class Target:
    """A bound on a ratio (or a count): ``measured / baseline <= at_most``, or ``== equals``."""

    text: str
    at_most: float | None = None
    equals: float | None = None

    at_least: float | None = None
    below: float | None = None

    @classmethod
    def parse(cls, text: str) -> Target:
        """The target a results file names by its ``text`` (``≤ 1.5``, ``≥ 10``, ``< 50 ms``,
        ``= 0 calls``, ``≤ 1.5 + 0.87 (one document)``)."""
        match = re.fullmatch(
            r"(≤|≥|<|=)\s*([0-9.]+)(?:\s*\+\s*([0-9.]+))?\s*(ms)?(?:\s.*)?", text.strip()
        )
        if match is None:
            raise ValueError(f"not a target: {text!r}")
        sign, number, plus, ms = match.groups()
        bound = (float(number) + float(plus or 0)) / (1000 if ms else 1)
        field = {"≤": "at_most", "≥": "at_least", "<": "below", "=": "equals"}[sign]
        return cls(text, **{field: bound})

    def met(self, value: float) -> bool:
        if self.equals is not None:
            return value == self.equals
        if self.at_least is not None:
            return value >= self.at_least
        if self.below is not None:
            return value < self.below
        assert self.at_most is not None
        return value <= self.at_most


@dataclass
class Row:
    """One line of the final table; ``fig`` is the figure's id (B1…B9, or Bn.x for context).

    ``runs`` holds the figure's value in each of several separate runs (:func:`across_runs`);
    empty, the row is one run's. The figure is the median of its runs, and so is the verdict.
    """

    fig: str
    benchmark: str
    baseline_label: str
    baseline: Samples
    measured_label: str
    measured: Samples
    target: Target | None = None
    # Which figure the target applies to: the ratio, or the measured value itself.
    target_on: str = "ratio"
    notes: list[str] = field(default_factory=list)
    runs: tuple[float, ...] = ()

    @property
    def run_ratio(self) -> float | None:
        """measured / baseline over the samples this row holds (one run's, or pooled)."""
        if self.baseline.median == 0:
            return None
        return self.measured.median / self.baseline.median

    @property
    def run_value(self) -> float | None:
        """The figure the target applies to over the samples this row holds."""
        return self.run_ratio if self.target_on == "ratio" else self.measured.median

    @property
    def values(self) -> tuple[float, ...]:
        """The figure in each separate run: ``runs``, or this row's own value."""
        if self.runs:
            return self.runs
        return () if self.run_value is None else (self.run_value,)

    @property
    def value(self) -> float | None:
        """The figure the target applies to: the median over the runs."""
        return statistics.median(self.values) if self.values else None

    @property
    def ratio(self) -> float | None:
        if self.runs and self.target_on == "ratio":
            return self.value
        return self.run_ratio

    @property
    def passed(self) -> bool | None:
        """Whether the median of the runs meets the target (None: no target)."""
        if self.target is None:
            return None
        value = self.value
        return value is not None and self.target.met(value)

    @classmethod
    def from_json(cls, figure: dict[str, Any]) -> Row:
        """The row a results file holds (:meth:`to_json`), to show it again."""

        def samples(side: dict[str, Any]) -> Samples:
            return Samples(tuple(side["values"]), unit=side["unit"])

        target = figure["target"]
        return cls(
            figure["id"],
            figure["benchmark"],
            figure["baseline"]["label"],
            samples(figure["baseline"]),
            figure["measured"]["label"],
            samples(figure["measured"]),
            None if target is None else Target.parse(target),
            target_on=figure["target_on"],
            notes=list(figure["notes"]),
            # A file written before figures were repeated holds one run's.
            runs=tuple(figure.get("run_values") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        values = self.values
        return {
            "id": self.fig,
            "value": self.value,
            "target": None if self.target is None else self.target.text,
            "pass": self.passed,
            "median": self.value,
            "min": min(values) if values else None,
            "max": max(values) if values else None,
            "runs": len(values),
            "run_values": list(values),
            "benchmark": self.benchmark,
            "baseline": {"label": self.baseline_label, **self.baseline.to_json()},
            "measured": {"label": self.measured_label, **self.measured.to_json()},
            "ratio": self.ratio,
            "target_on": self.target_on,
            "notes": self.notes,
        }


def across_runs(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """The rows of several separate runs of one benchmark, one per figure: its value in each
    run (``runs``; the median decides), and the samples of every run pooled, for context.
    A figure is listed where it first appears; its labels and target are its last run's."""
    by_fig: dict[str, list[Row]] = {}
    for rows in runs:
        for row in rows:
            by_fig.setdefault(row.fig, []).append(row)
    combined = []
    for rows in by_fig.values():
        last = rows[-1]
        combined.append(
            Row(
                last.fig,
                last.benchmark,
                last.baseline_label,
                Samples(tuple(v for r in rows for v in r.baseline.values), last.baseline.unit),
                last.measured_label,
                Samples(tuple(v for r in rows for v in r.measured.values), last.measured.unit),
                last.target,
                target_on=last.target_on,
                notes=list(dict.fromkeys(note for r in rows for note in r.notes)),
                runs=tuple(v for r in rows for v in r.values),
            )
        )
    return combined


# --- services -----------------------------------------------------------------------


NO_429 = Target("= 0", equals=0)


def ceiling_row(
    fig: str,
    benchmark: str,
    label: str,
    measured: float,
    target: Target,
    *,
    baseline_label: str = "target",
    notes: Sequence[str] = (),
) -> Row:
    """A row whose measured value must stay under ``target``, shown as its baseline."""
    ceiling = Samples((target.below or 0.0,))
    return Row(
        fig,
        benchmark,
        baseline_label,
        ceiling,
        label,
        Samples((measured,)),
        target,
        target_on="measured",
        notes=list(notes),
    )


def refusals_row(fig: str, benchmark: str, label: str, rejected: Sequence[float], **kw: Any) -> Row:
    """A row of the 429s a run caused, against none (``target``: ``NO_429`` unless given)."""
    kw.setdefault("target", NO_429)
    return Row(
        fig,
        benchmark,
        "requests refused",
        Samples((0.0,), unit="429s"),
        label,
        Samples(tuple(rejected), unit="429s"),
        target_on="measured",
        **kw,
    )


@dataclass(frozen=True)
class Services:
    """A private Postgres and local model server, alive for one benchmark."""

    dsn: str
    model: LocalModelServer


@contextmanager
def services(*, dim: int = 64) -> Iterator[Services]:
    """Start Postgres (pgserver) and the local model server under a temporary folder.

    Both are stopped on the way out, also after an error or Ctrl-C, so a run leaves no
    process behind. The model server binds 127.0.0.1 only.
    """
    with (
        tempfile.TemporaryDirectory(prefix="replayable-bench-") as tmp,
        LocalModelServer(dim=dim) as model,
    ):
        state = Path(tmp)
        try:
            started = devenv.start(state, model_url=model.base_url)
            yield Services(started.replayable_dsn, model)
        finally:
            devenv.stop(state)


def empty_ledger(dsn: str) -> None:
    """Empty every table of the replayable schema (:func:`devtools.devenv.empty_ledger`)."""
    conn = db.connect(dsn)
    try:
        devenv.empty_ledger(conn)
    finally:
        conn.close()


def truncate(dsn: str, tables: tuple[str, ...]) -> None:
    """Empty ``tables`` of the replayable schema (fixed names from this module only)."""
    conn = db.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("TRUNCATE " + ", ".join(f"replayable.{t}" for t in tables) + " CASCADE")
        conn.commit()
    finally:
        conn.close()


def load_sql(dsn: str, script: Path, params: dict[str, Any]) -> float:
    """Run ``script`` with ``params`` on an empty ledger, then ``VACUUM ANALYZE`` it, as a
    ledger that has run for a while would be; return the seconds both took."""
    started = time.perf_counter()
    conn = db.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(script.read_text(), params)
        conn.commit()
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
    finally:
        conn.close()
    return time.perf_counter() - started


# --- synthetic documents ------------------------------------------------------------

TESTS = Path(__file__).resolve().parents[1] / "tests"


@cache
def tests_module(name: str) -> Any:
    """The helper module ``tests/<name>.py`` (the corpus generators), which is not a package."""
    import importlib.util
    import sys

    path = TESTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"replayable_bench_{name}", path)
    if spec is None or spec.loader is None:
        raise BenchError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    # A module's dataclasses look the module up in sys.modules while they are being defined.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def corpus() -> Any:
    """The PDF corpus generator of tests/ (tests/corpus.py)."""
    return tests_module("corpus")


def pdf_corpus(n: int, *, seed: int = 11) -> Path:
    """``n`` generated PDFs, made once per machine under ``.local/bench-corpus`` and reused."""
    folder = Path(__file__).resolve().parents[1] / ".local" / "bench-corpus" / f"{n}-{seed}"
    done = folder / ".complete"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        corpus().write_sample_corpus(folder, n=n, seed=seed)
        done.write_text("ok\n")
    return folder


def realworld_corpus(n: int) -> tuple[Path, list[str]]:
    """``n`` PDFs repeated from the real-world corpus (tests/realworld.py: LibreOffice,
    Ghostscript, groff, pdfTeX, the PDFs Debian ships), made once per machine under
    ``.local/bench-corpus``; and what was built. Each copy ends with a comment line of its
    own after the file, so that every copy is a document of its own (documents are keyed by
    their bytes) whose pages and text are the original's. Files PDFium cannot open (Debian
    ships a few that are not PDFs) are left out. Empty when no producer is installed
    (tests/install-realworld-tools.sh installs them)."""
    from replayable.retry import ItemError
    from replayable.stages.extract.pdf import extract_file

    folder = ROOT / ".local" / "bench-corpus" / f"realworld-{n}"
    done = folder / ".complete"
    if done.exists():
        return folder, done.read_text().splitlines()
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="replayable-realworld-") as tmp:
        manifest = tests_module("realworld").build(Path(tmp) / "corpus")
        originals: list[bytes] = []
        refused: list[str] = []
        for entry in manifest.files:
            try:
                extract_file(str(manifest.folder / entry.file))
            except ItemError as error:
                refused.append(f"{entry.file} ({error.error_class})")
            else:
                originals.append((manifest.folder / entry.file).read_bytes())
        made = [f"{len(originals)} PDFs from {', '.join(manifest.contributors) or 'nothing'}"]
        if refused:
            made.append("left out, PDFium refuses them: " + ", ".join(refused))
    for i in range(n if originals else 0):
        copy = originals[i % len(originals)] + f"\n%replayable-bench copy {i}\n".encode()
        (folder / f"rw-{i:05d}.pdf").write_bytes(copy)
    done.write_text("\n".join(made) + "\n")
    return folder, made


_WORDS = (
    *("harbour", "ledger", "cargo", "tide", "manifest", "quay", "berth", "vessel", "crane"),
    *("pallet", "invoice", "customs", "pilot", "anchor", "draught", "tonnage", "freight"),
    *("route", "season", "charter", "broker", "insurance", "storm", "signal", "beacon"),
    *("survey", "mooring", "warehouse", "timber", "grain", "fuel", "ballast", "hull"),
)


def synthetic_text(doc: int, sentences: int) -> str:
    """A distinct, deterministic text of ``sentences`` sentences for document ``doc``."""
    out = []
    for s in range(sentences):
        words = [_WORDS[(doc * 7 + s * 3 + k * k) % len(_WORDS)] for k in range(9)]
        out.append(f"Report {doc} item {s}: " + " ".join(words) + f" at {doc * 1000 + s}.")
    return " ".join(out)


def seed_documents(dsn: str, n: int, sentences: int, *, extractor_version: str) -> list[str]:
    """Insert ``n`` documents with extracted text, as the extract stage would leave them."""
    conn = db.connect(dsn)
    ids: list[str] = []
    try:
        texts = [synthetic_text(i, sentences) for i in range(n)]
        doc_ids = [sha256_bytes(t.encode()) for t in texts]
        db.execute_values(
            conn,
            "plan/upsert_documents",
            [
                (d, f"/bench/{i}.pdf", len(t))
                for i, (d, t) in enumerate(zip(doc_ids, texts, strict=True))
            ],
        )
        db.execute_values(
            conn,
            "stages/insert_extraction",
            [
                (doc_id, extractor_version, 1, text, sha256_bytes(text.encode()), 0, "pdfium")
                for doc_id, text in zip(doc_ids, texts, strict=True)
            ],
        )
        ids = list(doc_ids)
        conn.commit()
    finally:
        conn.close()
    return sorted(ids)


def count_rows(dsn: str, table: str) -> int:
    """Rows in ``replayable.<table>`` (a fixed name from the benchmarks)."""
    conn = db.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM replayable.{table}")  # noqa: S608 - fixed names
            return int(cur.fetchone()[0])
    finally:
        conn.close()


# --- statement counting -------------------------------------------------------------


@cache
def _counting_cursor(base: type[Any]) -> type[Any]:
    """``base`` with an ``execute`` that adds one to its connection's statement count."""

    def execute(self: Any, query: Any, vars: Any = None) -> Any:
        self.connection.statements += 1
        return base.execute(self, query, vars)

    return type(f"Counting{base.__name__}", (base,), {"execute": execute})


class CountingConnection(psycopg2.extensions.connection):  # type: ignore[misc]  # untyped base
    """A psycopg2 connection that counts the statements its cursors send.

    A stand-in for ``pg_stat_statements``, which the embedded Postgres does not ship:
    every ``cursor.execute`` is one statement (``execute_values`` sends one per 500 rows).
    """

    statements = 0

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        base = kwargs.get("cursor_factory") or self.cursor_factory or psycopg2.extensions.cursor
        kwargs["cursor_factory"] = _counting_cursor(base)
        return super().cursor(*args, **kwargs)


class StatementCounter:
    """Opens counting connections and sums the statements sent on all of them."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._opened: list[CountingConnection] = []

    def database(self) -> db.Database:
        """A :class:`replayable.db.Database` whose connections count their statements."""
        return db.Database(self.dsn, connector=self.connect)

    def connect(self) -> Any:
        conn = psycopg2.connect(
            self.dsn, application_name="replayable-bench", connection_factory=CountingConnection
        )
        conn.autocommit = False
        self._opened.append(conn)
        return conn

    @property
    def statements(self) -> int:
        return sum(conn.statements for conn in self._opened)

    def reset(self) -> None:
        self._opened = [conn for conn in self._opened if not conn.closed]
        for conn in self._opened:
            conn.statements = 0


def pg_stat_statements_available(dsn: str) -> bool:
    """Whether the server can count statements itself (extension installed and preloaded)."""
    conn = db.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'")
            installed = cur.fetchone() is not None
            cur.execute("SHOW shared_preload_libraries")
            preloaded = "pg_stat_statements" in str(cur.fetchone()[0])
        return installed and preloaded
    finally:
        conn.close()


def server_statement_count(dsn: str, fn: Callable[[], Any]) -> int:
    """Statements the server ran in this database while ``fn`` ran, per pg_stat_statements.

    Only call this when :func:`pg_stat_statements_available` says so.
    """
    conn = db.connect(dsn, autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            cur.execute("SELECT pg_stat_statements_reset()")
            fn()
            cur.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND query NOT ILIKE '%pg_stat_statements%'"
            )
            return int(cur.fetchone()[0])
    finally:
        conn.close()
