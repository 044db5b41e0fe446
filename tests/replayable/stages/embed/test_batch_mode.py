"""embed_mode "batch": the embed stage through the provider's Batch API (ADR 0117), run in
this process against Postgres and the local model server, whose batch counters are the
provider's own: ``batch_line_charges`` counts each line charged, over every batch."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest

import corpus
import in_process
from checks import assert_nothing_lost, rows, scalar, subset
from replayable.cli import main

EMBED_PRICE = 0.02  # USD per million tokens, text-embedding-3-small; batch: half
FAST = {"embed_mode": "batch", "batch_poll_s": 0.1}


@pytest.fixture
def priced(monkeypatch):
    connection = json.loads(os.environ["AIRFLOW_CONN_REPLAYABLE_MODEL"])
    connection["extra"] = {
        **connection.get("extra", {}),
        "prices": {"text-embedding-3-small": {"input": EMBED_PRICE}},
    }
    monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_MODEL", json.dumps(connection))


@pytest.fixture(autouse=True)
def _deferrals():
    in_process.DEFERRALS.clear()
    yield
    in_process.DEFERRALS.clear()


def _stored_vectors(conn) -> dict[str, tuple[str, list[float]]]:
    found = rows(
        conn,
        "SELECT e.chunk_id, c.text, e.embedding::text FROM replayable.embeddings e"
        " JOIN replayable.chunks c USING (chunk_id)",
    )
    return {cid: (text, json.loads(vector)) for cid, text, vector in found}


def _charged_twice(model) -> dict[str, int]:
    return {k: n for k, n in model.stats()["batch_line_charges"].items() if n > 1}


def test_a_batch_run_stores_the_sync_vectors_pays_each_line_once_at_half_the_price(
    run_in_process, priced, conn, dsn, model, tmp_path, capsys
):
    model.set_faults(batch_delay_s=0.3)
    report = run_in_process({"source": str(subset(tmp_path, 6)), **FAST})
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["embed"]["done"] == 6
    assert in_process.DEFERRALS  # the task waited on the trigger, not in a worker
    stats = model.stats()
    assert stats["charged"] == 0  # no synchronous embeddings request
    assert stats["batches_created"] >= 1
    assert stats["batch_lines_charged"] == len(stats["batch_line_charges"]) > 0
    assert _charged_twice(model) == {}
    # The same vectors as the synchronous endpoint gives for the same texts.
    stored = _stored_vectors(conn)
    texts = [text for text, _ in stored.values()]
    answer = httpx.post(
        f"{model.base_url}/embeddings",
        json={"model": "text-embedding-3-small", "input": texts},
        timeout=30,
    ).json()
    for (_, vector), row in zip(stored.values(), answer["data"], strict=True):
        assert vector == pytest.approx(row["embedding"], abs=1e-6)
    # The run's cost: the tokens the provider charged, at half the sync price.
    ((entry),) = report["cost"]["by_model"]
    assert (entry["model"], entry["mode"]) == ("text-embedding-3-small", "batch")
    assert entry["calls"] == stats["batch_lines_charged"]
    assert entry["input_tokens"] == stats["batch_tokens_charged"]
    assert report["cost"]["usd"] == pytest.approx(
        stats["batch_tokens_charged"] * EMBED_PRICE / 2 / 1e6, rel=1e-9
    )
    # The CLI (and the UI overview, which reads the same views): the run, and 30 days.
    expected = stats["batch_tokens_charged"] * EMBED_PRICE / 2 / 1e6
    for args in (("status", "--run", report["run_id"]), ("status",)):
        capsys.readouterr()  # what the run printed
        assert main(["--dsn", dsn, "--json", *args]) == 0
        shown = json.loads(capsys.readouterr().out)["cost"]
        assert shown["usd"] == pytest.approx(expected, rel=1e-9)
        assert [(m["mode"], m["calls"]) for m in shown["by_model"]] == [
            ("batch", stats["batch_lines_charged"])
        ]
    # Nothing left at the provider: the input and result files are deleted once collected.
    assert scalar(conn, "SELECT count(*) FROM replayable.provider_batch_chunks") == 0
    assert_nothing_lost(conn)

    again = run_in_process({"source": str(subset(tmp_path, 6)), **FAST})
    assert (again["to_do"], again["batches"]) == (0, 0)
    assert model.stats()["batches_created"] == stats["batches_created"]


def _lines(conn) -> list[tuple[str, str, int]]:
    """Every recorded line: (submission, custom_id, status), in submission order."""
    return rows(
        conn,
        "SELECT l.submission, l.custom_id, l.status FROM replayable.provider_batch_lines l"
        " JOIN replayable.provider_batches b USING (submission) ORDER BY b.created_at, l.custom_id",
    )


def test_a_line_refused_as_bad_dead_letters_only_its_document(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 4)
    corpus.write_pdf(folder / "poisoned.pdf", ["This text makes the provider answer POISON-400."])
    model.set_faults(batch_delay_s=0.2, batch_fail_inputs_containing={"POISON-400": 400})
    report = run_in_process({"source": str(folder), **FAST})
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["embed"]["done"] == 4
    assert report["stages"]["embed"]["dead"] == 1
    assert rows(conn, "SELECT error_class, attempts FROM replayable.dead_letters") == [
        ("http_400", 1)
    ]
    assert _charged_twice(model) == {}
    assert_nothing_lost(conn)


def test_a_line_that_keeps_failing_is_sent_again_in_the_next_batch_until_the_cap(
    run_in_process, conn, model, tmp_path
):
    folder = subset(tmp_path, 3)
    corpus.write_pdf(folder / "flaky.pdf", ["This text makes the provider answer POISON-503."])
    model.set_faults(batch_delay_s=0.2, batch_fail_inputs_containing={"POISON-503": 503})
    # A line per chunk: the failing line holds only the flaky document's chunk.
    report = run_in_process({"source": str(folder), "embed_inputs_per_call": 1, **FAST})
    assert report["stages"]["embed"]["done"] == 3
    assert report["stages"]["embed"]["dead"] == 1
    assert rows(conn, "SELECT error_class, attempts FROM replayable.dead_letters") == [
        ("http_503", 3)
    ]
    flaky = rows(
        conn,
        "SELECT custom_id, count(DISTINCT submission) FROM replayable.provider_batch_lines"
        " WHERE status = 'failed' GROUP BY 1",
    )
    assert [n for _, n in flaky] == [3]  # the same line, in three batches, one per attempt
    assert _charged_twice(model) == {}
    assert_nothing_lost(conn)


def _first_batch_only(monkeypatch, model, **faults):
    """Run the first batch created under ``faults``, the later ones under none."""
    from replayable.models.batch_api import BatchApi

    created = BatchApi.create
    model.set_faults(**faults)

    def create(self, submission, file_id):
        job = created(self, submission, file_id)
        model.set_faults(batch_delay_s=faults["batch_delay_s"])
        return job

    monkeypatch.setattr(BatchApi, "create", create)


def test_a_line_that_misses_window_after_window_fails_its_documents_at_their_cap(
    run_in_process, conn, model, tmp_path
):
    model.set_faults(batch_delay_s=0.1, batch_expire_after_fraction=0.0)
    report = run_in_process({"source": str(subset(tmp_path, 2)), **FAST})
    assert not report["_failed"], report["_tasks"]  # dead letters, not items left to do
    assert report["stages"]["embed"]["dead"] == 2
    assert {c for (c,) in rows(conn, "SELECT error_class FROM replayable.dead_letters")} == {
        "batch_expired"
    }
    assert model.stats()["batch_lines_charged"] == 0
    assert_nothing_lost(conn)


def test_an_expired_batch_keeps_its_done_lines_and_sends_only_the_rest_again(
    run_in_process, conn, model, tmp_path, monkeypatch
):
    _first_batch_only(monkeypatch, model, batch_delay_s=0.2, batch_expire_after_fraction=0.6)
    report = run_in_process(
        {"source": str(subset(tmp_path, 5)), "embed_inputs_per_call": 2, **FAST}
    )
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["embed"]["done"] == 5
    lines = _lines(conn)
    submissions = list(dict.fromkeys(sub for sub, _, _ in lines))
    first = [(cid, status) for sub, cid, status in lines if sub == submissions[0]]
    second = {cid for sub, cid, _ in lines if sub == submissions[1]}
    done = {cid for cid, status in first if status == "done"}
    resent = {cid for cid, status in first if status == "resent"}
    assert len(done) == int(len(first) * 0.6) and done | resent == {c for c, _ in first}
    assert second == resent  # only the 40 % not done, under the same custom_ids
    assert _charged_twice(model) == {}
    assert_nothing_lost(conn)


def test_a_cancelled_batch_keeps_its_done_lines_and_sends_only_the_rest_again(
    run_in_process, conn, model, tmp_path, monkeypatch
):
    from replayable.models.batch_api import BatchApi

    _first_batch_only(monkeypatch, model, batch_delay_s=0.4, batch_cancel_after_fraction=0.5)
    created = BatchApi.create
    cancelled: list[str] = []

    def create_then_cancel(self, submission, file_id):
        job = created(self, submission, file_id)
        if not cancelled:  # the first batch only, as a person would
            cancelled.append(job.id)
            self._http.post(f"/batches/{job.id}/cancel").raise_for_status()
        return job

    monkeypatch.setattr(BatchApi, "create", create_then_cancel)
    report = run_in_process(
        {"source": str(subset(tmp_path, 4)), "embed_inputs_per_call": 2, **FAST}
    )
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["embed"]["done"] == 4
    statuses = rows(
        conn, "SELECT provider_status FROM replayable.provider_batches ORDER BY created_at"
    )
    assert statuses[0] == ("cancelled",) and statuses[-1] == ("completed",)
    assert _charged_twice(model) == {}
    assert_nothing_lost(conn)


class Killed(Exception):
    """Stands for a worker killed at this point: nothing after it runs in this try."""


def _batch_spec(dsn, model, **overrides):
    from replayable import db
    from replayable.budget import RequestBudget
    from replayable.models.batch_api import BatchApi
    from replayable.models.embeddings import HttpEmbeddingClient
    from replayable.retry import CallRetry
    from replayable.stages.embed.spec import EmbedSpec

    retry = CallRetry(max_attempts=4, base_s=0.01, cap_s=0.05, max_total_s=10)
    client = HttpEmbeddingClient(base_url=model.base_url, model="m", retry=retry)
    api = BatchApi(base_url=model.base_url, model="m", retry=retry)

    def connect():
        return db.Database(dsn, outage_s=30)

    spec = EmbedSpec(
        provider=client,
        model="m",
        chunker_key=CHUNKS.key,
        connect=connect,
        budget=RequestBudget(model.base_url, 4),
        mode="batch",
        batches=api,
        **{"inputs_per_call": 2, **overrides},
    )
    return spec, connect


CHUNKS = None  # set by _chunked


def _chunked(conn, dsn, n):
    """``n`` documents extracted and chunked; return their ids."""
    global CHUNKS
    from test_embed_sessions import CHUNKS as chunks
    from test_embed_sessions import seed

    from replayable import db
    from replayable.ledger import RunContext
    from replayable.runner import run_batch
    from replayable.stages.chunk.spec import ChunkSpec

    CHUNKS = chunks
    doc_ids = seed(conn, n)

    def connect():
        return db.Database(dsn, outage_s=30)

    run_batch(
        ChunkSpec(config=chunks, connect=connect),
        doc_ids,
        connect=connect,
        ctx=RunContext(owner="chunker", run_id="r"),
    )
    return doc_ids


def _try(spec, connect, doc_ids, n):
    from replayable.ledger import RunContext
    from replayable.runner import run_batch

    return run_batch(spec, doc_ids, connect=connect, ctx=RunContext(owner=f"try{n}", run_id="r"))


def test_a_task_retried_while_its_batch_runs_waits_on_the_same_batch(conn, dsn, model):
    doc_ids = _chunked(conn, dsn, 3)
    model.set_faults(batch_delay_s=1.0)
    spec, connect = _batch_spec(dsn, model)
    first = _try(spec, connect, doc_ids, 1)
    assert first.systemic is not None and first.systemic.error_class == "batch_waiting"
    waiting = list(spec.waiting_on)
    assert len(waiting) == 1 and waiting[0].startswith("batch_")
    # The task is retried (cleared, or its worker died while it was deferred) at once.
    second = _try(spec, connect, doc_ids, 2)
    assert second.systemic is not None and spec.waiting_on == waiting
    assert model.stats()["batches_created"] == 1
    time.sleep(1.2)
    third = _try(spec, connect, doc_ids, 3)
    assert sorted(third.done) == doc_ids
    stats = model.stats()
    assert stats["batches_created"] == 1 and _charged_twice(model) == {}


@pytest.mark.parametrize("killed_at", ["after the upload", "after the batch was created"])
def test_a_worker_killed_before_the_batch_id_is_recorded_pays_for_no_line_twice(
    conn, dsn, model, monkeypatch, killed_at
):
    from replayable.models.batch_api import BatchApi
    from replayable.stages.embed import batch_submit

    doc_ids = _chunked(conn, dsn, 3)
    model.set_faults(batch_delay_s=0.3)
    spec, connect = _batch_spec(dsn, model)
    original_create, original_execute = BatchApi.create, batch_submit.execute

    def create(self, submission, file_id):
        if killed_at == "after the upload":
            raise Killed(killed_at)
        return original_create(self, submission, file_id)

    def execute(conn, query, params=None):
        if query == "batches/set_batch":
            raise Killed(killed_at)
        return original_execute(conn, query, params)

    monkeypatch.setattr(BatchApi, "create", create)
    if killed_at != "after the upload":
        monkeypatch.setattr(batch_submit, "execute", execute)
    first = _try(spec, connect, doc_ids, 1)
    assert first.failed and not first.done  # the try failed where it was killed
    monkeypatch.setattr(BatchApi, "create", original_create)
    monkeypatch.setattr(batch_submit, "execute", original_execute)
    second = _try(spec, connect, doc_ids, 2)  # the task's retry
    assert second.systemic is not None and second.systemic.error_class == "batch_waiting"
    time.sleep(0.5)
    third = _try(spec, connect, doc_ids, 3)
    assert sorted(third.done) == doc_ids
    stats = model.stats()
    assert stats["files_uploaded"] == 1  # the retry found the file, and the batch, again
    assert stats["batches_created"] == 1
    assert _charged_twice(model) == {}


def test_a_lost_upload_answer_leaves_at_most_one_orphan_file_which_a_sweep_deletes(
    conn, dsn, model
):
    from replayable.stages.embed.batch_files import sweep_orphan_files

    doc_ids = _chunked(conn, dsn, 2)
    model.set_faults(batch_delay_s=0.2, lose_upload_responses=1)
    spec, connect = _batch_spec(dsn, model)
    _try(spec, connect, doc_ids, 1)
    time.sleep(0.3)
    assert sorted(_try(spec, connect, doc_ids, 2).done) == doc_ids
    stats = model.stats()
    assert stats["upload_responses_lost"] == 1 and stats["batches_created"] == 1
    listed = httpx.get(f"{model.base_url}/files", params={"purpose": "batch"}).json()["data"]
    assert len(listed) == 1  # the upload whose answer was lost; the used one is deleted
    assert sweep_orphan_files(spec.batches, conn, older_than_s=0) == [listed[0]["id"]]
    assert httpx.get(f"{model.base_url}/files", params={"purpose": "batch"}).json()["data"] == []
    assert _charged_twice(model) == {}


class _Io:
    """What a pass reports to, for a pass run outside the runner."""

    stopping = False

    def __init__(self):
        self.outcomes = {}

    def attempt(self, item):
        return 1

    def holds(self, item):
        return True

    def done(self, item, writes=()):
        self.outcomes[item.doc_id] = "done"

    def failed(self, item, error):
        self.outcomes[item.doc_id] = "failed"

    def stop(self, error):
        self.stopping = True


def test_a_pass_leaves_no_database_session_open(conn, dsn, model):
    from replayable.stages.embed.batch import BatchModeEmbed

    doc_ids = _chunked(conn, dsn, 2)
    model.set_faults(batch_delay_s=0)
    spec, _ = _batch_spec(dsn, model)
    items = spec.plan(conn, doc_ids)
    conn.commit()
    for _ in range(2):  # submit (the batch is done at once), then collect
        io = _Io()
        one = BatchModeEmbed(spec, items, io)
        one.run()
        assert one.db._conn is None  # closed, and not opened again after
    assert set(io.outcomes.values()) == {"done"}


def test_a_batch_another_task_collected_first_is_not_read_again(conn, dsn, model):
    """Two tasks wait on one batch (their documents share chunks). The first to wake collects
    it and deletes its files; the second, which read the batch as running a moment before,
    must find it collected, not fetch files that are gone (found at 1,000 documents: a 404
    that dead-lettered a whole batch of documents)."""
    from replayable.stages.embed.batch import BatchModeEmbed

    doc_ids = _chunked(conn, dsn, 2)
    model.set_faults(batch_delay_s=0.2)
    spec, connect = _batch_spec(dsn, model)
    _try(spec, connect, doc_ids, 1)
    stale = rows(conn, "SELECT submission, batch_id FROM replayable.provider_batches")
    time.sleep(0.3)
    assert sorted(_try(spec, connect, doc_ids, 2).done) == doc_ids  # collected, files deleted
    ((submission, batch_id),) = stale
    late = BatchModeEmbed(spec, [], _Io())
    try:
        late._advance(
            {"submission": submission, "batch_id": batch_id, "provider": spec.batches.base_url}
        )
    finally:
        late.db.close()
    assert late.errors == {}
    assert _charged_twice(model) == {}


def test_a_refusal_of_the_batch_api_itself_is_no_documents_fault(model):
    """A Files or Batch API call carries no document's input: its 4xx is retryable (within
    the items' attempts), never a dead letter at once."""
    from replayable.models.batch_api import BatchApi
    from replayable.retry import ErrorKind, ItemError, classify

    api = BatchApi(base_url=model.base_url, model="m")
    try:
        with pytest.raises(ItemError) as gone:
            api.content("file-that-is-not-there")
        assert (gone.value.error_class, gone.value.kind) == ("http_404", ErrorKind.RETRYABLE)
    finally:
        api.close()
    assert classify(gone.value).kind is ErrorKind.RETRYABLE


def test_lines_past_the_providers_per_batch_limits_are_split_into_several_batches(conn, dsn, model):
    from replayable.stages.embed.config import BatchLimits

    doc_ids = _chunked(conn, dsn, 3)
    # The provider refuses (fails) a batch of more than 3 requests or 5 inputs.
    model.set_faults(batch_delay_s=0.2, batch_max_requests=3, batch_max_inputs=5)
    spec, connect = _batch_spec(dsn, model, batch_limits=BatchLimits(requests=3, inputs=5))
    _try(spec, connect, doc_ids, 1)
    time.sleep(0.3)
    assert sorted(_try(spec, connect, doc_ids, 2).done) == doc_ids
    sizes = rows(conn, "SELECT lines, inputs FROM replayable.provider_batches")
    assert len(sizes) > 1 and all(n <= 3 and k <= 5 for n, k in sizes)
    ended = rows(conn, "SELECT DISTINCT provider_status FROM replayable.provider_batches")
    assert ended == [("completed",)]
    assert _charged_twice(model) == {}


def test_a_provider_without_the_batch_api_stops_the_batch_without_spending_attempts(
    conn, dsn, model
):
    from replayable.models.batch_api import BatchApi

    doc_ids = _chunked(conn, dsn, 2)
    spec, connect = _batch_spec(dsn, model)
    spec.batches = BatchApi(base_url=f"{model.base_url}/no-such-api", model="m")
    result = _try(spec, connect, doc_ids, 1)
    assert result.systemic is not None
    assert result.systemic.error_class == "batch_api_unavailable"
    assert 'use embed_mode "sync"' in result.systemic.message
    assert rows(
        conn, "SELECT status, attempts FROM replayable.stage_runs WHERE stage = 'embed'"
    ) == [("failed", 0), ("failed", 0)]
    assert scalar(conn, "SELECT count(*) FROM replayable.dead_letters") == 0


def test_a_batch_the_provider_fails_as_a_whole_fails_its_documents_with_the_reason(
    conn, dsn, model
):
    """A batch that fails validation ran no line: its documents fail (an attempt each, so
    the cap bounds it) with the provider's reason, instead of being sent again as it was."""
    doc_ids = _chunked(conn, dsn, 2)
    model.set_faults(batch_delay_s=0, batch_max_requests=1)  # the client sends more
    spec, connect = _batch_spec(dsn, model)
    _try(spec, connect, doc_ids, 1)
    result = _try(spec, connect, doc_ids, 2)
    assert sorted(result.failed) == doc_ids
    assert result.errors == {"batch_failed": 2}
    reason = rows(
        conn, "SELECT DISTINCT last_error FROM replayable.stage_runs WHERE stage = 'embed'"
    )
    assert "at most 1 are allowed" in reason[0][0], reason
    assert model.stats()["batch_lines_charged"] == 0
