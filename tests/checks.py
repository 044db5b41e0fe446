"""Ledger checks shared by the end-to-end tests."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

from helpers import ROOT
from replayable import db
from replayable.keys import sha256_bytes
from replayable.stages import extract
from replayable.stages.builtin import document_pipeline
from replayable.vocabulary import DEFAULT_STAGES

SAMPLES = ROOT / "data" / "samples"
# Short documents on unrelated subjects, one chunk each: a search finds one by its meaning.
TOPICS = {
    "bees.pdf": "Honey bees live in colonies around a single queen. Beekeepers inspect the "
    "hives in spring and harvest the honey in late summer.",
    "tides.pdf": "Tide pools form on rocky shores when the sea retreats at low tide. Starfish, "
    "anemones and small crabs shelter in them until the water returns.",
    "bread.pdf": "Sourdough bread rises with the wild yeast of a starter. Knead the dough, "
    "let it proof overnight, then bake it in a very hot oven.",
    "ledger.pdf": "The accounting ledger records every invoice and payment. Reconcile the "
    "balances at the end of each month before the books are closed.",
}


def topic_pdfs(folder: Path, texts: dict[str, str]) -> Path:
    """``folder`` with a one-page PDF per name of ``texts`` (e.g. :data:`TOPICS`)."""
    import corpus

    folder.mkdir(exist_ok=True)
    for name, text in texts.items():
        corpus.write_pdf(folder / name, [text])
    return folder


def rows(conn: Any, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(sql, params)
        found = cur.fetchall()
    conn.commit()
    return list(found)


def scalar(conn: Any, sql: str, *params: Any) -> Any:
    return rows(conn, sql, *params)[0][0]


def fresh_minute(conn: Any, needed_s: float) -> None:
    """Wait, when fewer than ``needed_s`` seconds are left of the database's minute, for the
    next one: the searches a test counts then fall in one minute (ADR 0153)."""
    left = float(scalar(conn, "SELECT 60 - extract(second FROM clock_timestamp())"))
    if left < needed_s:
        time.sleep(left + 0.1)


def seed_extraction(conn: Any, doc_id: str, path: str, text: str, size: int | None = None) -> None:
    """A document and its text as the extract stage stores them (default extractor, PDFium).

    The caller commits.
    """
    db.execute_values(
        conn, "plan/upsert_documents", [(doc_id, path, len(text) if size is None else size)]
    )
    db.execute_values(
        conn,
        "stages/insert_extraction",
        [(doc_id, extract.extractor_id(), 1, text, sha256_bytes(text.encode()), 0, "pdfium")],
    )


def output_rows(conn: Any) -> dict[str, int]:
    tables = (
        "documents",
        "extractions",
        "chunks",
        "doc_chunks",
        "embeddings",
        "artifacts",
        "item_artifacts",
        "dead_letters",
    )
    # Table names are the constants above, not input.
    return {t: scalar(conn, f"SELECT count(*) FROM replayable.{t}") for t in tables}  # noqa: S608


def assert_nothing_lost(conn: Any, *, one_version: bool = True) -> None:
    """Per stage, items in = done + failed + dead: nothing pending, running or vanished.

    With ``one_version`` (every row under one code version per stage) it also checks that a
    document entered each stage exactly when the stage before finished it.
    """
    documents = scalar(conn, "SELECT count(*) FROM replayable.documents")
    entered = dict(rows(conn, "SELECT stage, count(*) FROM replayable.stage_runs GROUP BY stage"))
    ended = dict(
        rows(
            conn,
            "SELECT stage, count(*) FROM replayable.stage_runs"
            " WHERE status IN ('done', 'failed', 'dead') GROUP BY stage",
        )
    )
    assert entered == ended
    if not one_version:
        return
    assert entered.get("extract") == documents
    for after, before in document_pipeline().inputs().items():
        if before is None or (after not in DEFAULT_STAGES and after not in entered):
            continue  # a stage a run asks for (summarize) is checked where one did
        done_before = scalar(
            conn,
            "SELECT count(*) FROM replayable.stage_runs WHERE stage = %s AND status = 'done'",
            before,
        )
        assert entered.get(after, 0) == done_before
    # Every dead item has one letter still on the work list (open, or ignored on purpose).
    unresolved = scalar(
        conn, "SELECT count(*) FROM replayable.dead_letters WHERE status IN ('open', 'ignored')"
    )
    assert unresolved == scalar(
        conn, "SELECT count(*) FROM replayable.stage_runs WHERE status = 'dead'"
    )


def subset(tmp_path: Path, n: int) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir(exist_ok=True)
    for path in sorted(SAMPLES.glob("*.pdf"))[:n]:
        shutil.copy(path, folder / path.name)
    return folder


def scrape_metrics(
    dsn: str, monkeypatch: Any
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/replayable/metrics`` of a UI app on ``dsn``, scraped with its token, keyed like
    :func:`ledger_metrics`."""
    from airflow.api_fastapi.app import create_auth_manager
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from replayable.web import create_app
    from replayable.web.metrics import TOKEN_VARIABLE

    token = "scrape-token"  # noqa: S105 - a test value
    monkeypatch.setenv(f"AIRFLOW_VAR_{TOKEN_VARIABLE.upper()}", token)
    create_auth_manager()
    root = FastAPI()
    root.mount("/replayable", create_app(dsn_provider=lambda: dsn))
    response = TestClient(root).get(
        "/replayable/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 200, response.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def ledger_metrics(conn: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What /replayable/metrics must say, counted from the ledger's own tables.

    Keyed like a parsed scrape: (sample name, sorted labels). Counts come from stage_runs,
    dead_letters and model_calls directly, never from the counters the endpoint reads.
    """
    from replayable.settings import STAGES
    from replayable.web.metrics import LATENCY_BOUNDS_MS

    def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return name, tuple(sorted(labels.items()))

    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    current = dict(
        ((stage, status), n)
        for stage, status, n in rows(
            conn,
            "SELECT stage, status, count(*) FROM replayable.stage_runs WHERE is_current"
            " GROUP BY stage, status",
        )
    )
    for stage in STAGES:
        for status in ("pending", "running", "done", "failed", "dead"):
            expected[key("replayable_items", stage=stage, status=status)] = current.get(
                (stage, status), 0
            )
    letters = {
        stage: (n_open, n)
        for stage, n_open, n in rows(
            conn,
            "SELECT stage, count(*) FILTER (WHERE status = 'open'), count(*)"
            " FROM replayable.dead_letters GROUP BY stage",
        )
    }
    for stage in STAGES:
        n_open, n = letters.get(stage, (0, 0))
        expected[key("replayable_dead_letters_open", stage=stage)] = n_open
        expected[key("replayable_dead_letters_created_total", stage=stage)] = n
    for stage, outcome, n in rows(
        conn, "SELECT stage, status, count(*) FROM replayable.model_calls GROUP BY stage, status"
    ):
        expected[key("replayable_model_calls_total", stage=stage, outcome=outcome)] = n
    latency = "replayable_model_call_latency_seconds"
    for stage, retries, tokens, n, total_ms in rows(
        conn,
        "SELECT stage, count(*) FILTER (WHERE call_try > 1), sum(tokens), count(*),"
        " sum(latency_ms) FROM replayable.model_calls GROUP BY stage",
    ):
        expected[key("replayable_model_call_retries_total", stage=stage)] = retries
        expected[key("replayable_model_tokens_total", stage=stage)] = tokens
        expected[key(f"{latency}_count", stage=stage)] = n
        expected[key(f"{latency}_sum", stage=stage)] = total_ms / 1000
        expected[key(f"{latency}_bucket", stage=stage, le="+Inf")] = n
        for bound in LATENCY_BOUNDS_MS:
            expected[key(f"{latency}_bucket", stage=stage, le=str(bound / 1000))] = scalar(
                conn,
                "SELECT count(*) FROM replayable.model_calls WHERE stage = %s AND latency_ms <= %s",
                stage,
                bound,
            )
    # What answered calls cost, by model and mode (ADR 0110); a call with no model recorded
    # (before migration 0011) is the model "unknown".
    for model, mode, usd, unpriced in rows(
        conn,
        "SELECT coalesce(model, 'unknown'), mode, coalesce(sum(cost_usd), 0)::float8,"
        " count(*) FILTER (WHERE cost_usd IS NULL) FROM replayable.model_calls"
        " WHERE status = 'ok' GROUP BY 1, 2",
    ):
        expected[key("replayable_model_cost_total", mode=mode, model=model)] = usd
        expected[key("replayable_model_unpriced_calls_total", mode=mode, model=model)] = unpriced
    # The outbox (ADR 0072). The backlog's age is exact only with nothing pending (0): a
    # scrape and this count read the clock at different moments.
    outbox = {
        status: (n, entered)
        for status, n, entered in rows(
            conn, "SELECT status, count(*), count(*) FROM replayable.outbox GROUP BY status"
        )
    }
    for status in ("pending", "published", "dead"):
        expected[key("replayable_outbox_events", status=status)] = outbox.get(status, (0, 0))[0]
    expected[key("replayable_outbox_published_total")] = outbox.get("published", (0, 0))[1]
    expected[key("replayable_outbox_dead_lettered_total")] = outbox.get("dead", (0, 0))[1]
    expected[key("replayable_outbox_oldest_pending_age_seconds")] = scalar(
        conn,
        "SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8"
        " FROM replayable.outbox WHERE status = 'pending'",
    )
    return expected


def arrivals_ahead(arrivals: list[float], rate: float, since: float) -> float:
    """How many more requests had reached the provider by some moment than ``rate`` a second
    allows from ``since``: max over k of (k + 1) - rate * (t_k - since), over the provider's
    own arrival times (``model.arrivals()``) sorted, on the monotonic clock.

    A budget that reserves each send time 1 / ``rate`` after the one before, the first no
    earlier than ``since``, keeps this at 1 however late its requests go: each is sent no
    earlier than its reservation, so the k-th to arrive (from 0) arrives no earlier than
    ``since`` + k / ``rate``. A request held back by a loaded machine only lowers it; one sent
    without a reservation, or before its time, raises it.
    """
    return max((k + 1 - rate * (t - since) for k, t in enumerate(sorted(arrivals))), default=0.0)


class ProviderSampler:
    """Samples the model server's request counter while a run goes on (a background thread).

    The counter is the provider's own (requests received), so the samples say what the
    provider saw: how many requests arrived between any two moments.
    """

    def __init__(self, model: Any, every_s: float = 0.05) -> None:
        self.model = model
        self.every_s = every_s
        self.samples: list[tuple[float, int]] = []  # (when the answer came, requests)
        self._asked: list[float] = []  # when each sample was asked for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="provider-sampler", daemon=True)

    def __enter__(self) -> ProviderSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.monotonic()
            requests = int(self.model.stats()["requests"])
            self.samples.append((time.monotonic(), requests))
            self._asked.append(asked)
            self._stop.wait(self.every_s)

    def worst_window(self, rate: float) -> tuple[int, float]:
        """The most requests that arrived in any window between samples, over ``rate`` allows.

        Returns (excess, window seconds): ``excess`` is max(arrived - rate * window), which a
        budget of ``rate`` with a burst of B keeps at or below B (plus one for the sampling).
        The server counted each sample somewhere between asking for it and its answer, so
        the requests between two samples arrived within the widest window that allows:
        from the first one's asking to the second one's answer. On a loaded machine the
        stats call itself can take a while; the narrow window would count that as a burst.
        """
        # max over i < j of (c_j - rate*answered_j) - (c_i - rate*asked_i): one pass with a
        # running minimum.
        worst, window = float("-inf"), 0.0
        low, low_t = float("inf"), 0.0
        for (t, c), asked in zip(self.samples, self._asked, strict=True):
            level = c - rate * t
            if level - low > worst:
                worst, window = level - low, t - low_t
            start = c - rate * asked
            if start < low:
                low, low_t = start, asked
        return (int(worst) if worst != float("-inf") else 0), window

    def busy_span(self) -> tuple[int, float]:
        """Requests counted, and the seconds from the first sample that saw one to the last
        sample before the count stopped changing."""
        counts = [c for _, c in self.samples]
        if not counts or counts[-1] == counts[0]:
            return 0, 0.0
        first = next(t for t, c in self.samples if c > counts[0])
        last = next(t for t, c in self.samples if c == counts[-1])
        return counts[-1] - counts[0], last - first


# --- Airflow's metadata database (the same Postgres server as the ledger) ---------------

READY_URI = "replayable://documents/ready"


def metadata_rows(env: dict[str, str], sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows from Airflow's metadata database (the same Postgres server)."""
    metadata = db.connect(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("+psycopg2", ""))
    try:
        return rows(metadata, sql, *params)
    finally:
        metadata.close()


def asset_events(env: dict[str, str], run_id: str) -> list[dict[str, Any]]:
    found = metadata_rows(
        env,
        "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id"
        " WHERE a.uri = %s AND e.source_run_id = %s",
        READY_URI,
        run_id,
    )
    return [extra for (extra,) in found]


def task_states(env: dict[str, str], dag_id: str, run_id: str) -> dict[str, str]:
    return dict(
        metadata_rows(
            env,
            "SELECT task_id, state FROM task_instance WHERE dag_id = %s AND run_id = %s"
            " AND map_index = -1",
            dag_id,
            run_id,
        )
    )


# The README's one-file pipeline of a stage of your own ("Write your own stage"): its DAG id.
README_EXAMPLE_DAG = "top_words_pipeline"


def readme_stage_example() -> str:
    """The first Python block of the README's "Write your own stage", as a user copies it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Write your own stage") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("```\n", start)]


def paste_readme_example(dags: Path, name: str = "top_words.py") -> Path:
    """A copy of the project's ``dags/`` in ``dags``, with the README's example pasted into a
    new file of it, as a user would: the folder a stock Airflow parses."""
    shutil.copytree(ROOT / "dags", dags, ignore=shutil.ignore_patterns("__pycache__"))
    path = dags / name
    path.write_text(readme_stage_example())
    return path
