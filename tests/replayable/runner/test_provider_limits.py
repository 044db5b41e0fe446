"""The provider's limits a batch keeps: requests in flight, requests a second and tokens a
minute, shared by every worker through Postgres."""

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from checks import arrivals_ahead
from devtools.model_server import LocalModelServer
from helpers.runner import (
    CHUNKS,
    chunk_digests,
    connect_to,
    embed_spec,
    on_workers,
    paid_once,
    run,
    seed_documents,
)
from replayable.budget import RequestBudget
from replayable.stages.chunk.spec import ChunkSpec

pytestmark = pytest.mark.db


@pytest.fixture
def model() -> Iterator[LocalModelServer]:
    """A provider of the test's own: all its counters and arrival times hold came from this
    test (a request another test of the session left going reaches the shared server)."""
    with LocalModelServer(dim=32) as server:
        yield server


def test_the_provider_never_sees_more_requests_in_flight_than_the_budget(conn, dsn, model):
    """Three workers with four threads each share one budget of two requests in flight."""
    doc_ids = seed_documents(conn, 12)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    model.set_faults(latency_ms=40, max_concurrency=2)
    results = []

    def worker(part, n):
        spec = embed_spec(model.base_url, dsn, in_flight=2, per_call=2)
        results.append(run(spec, dsn, part, owner=f"w{n}"))

    on_workers(worker, [doc_ids[0::3], doc_ids[1::3], doc_ids[2::3]])
    stats = model.stats()
    assert stats["rejected_concurrency"] == 0
    assert stats["peak_in_flight"] == 2
    assert sum(len(r.done) for r in results) == len(doc_ids)
    paid_once(model, conn)


def test_a_task_keeps_to_its_own_max_in_flight_under_a_larger_shared_budget(conn, dsn, model):
    """A run that asked for fewer requests in flight than the connection's budget keeps to
    its own number (ADR 0086), whatever slots the shared budget has free."""
    doc_ids = seed_documents(conn, 8)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    model.set_faults(latency_ms=60)
    spec = embed_spec(model.base_url, dsn, in_flight=2, per_call=1)
    spec.budget = RequestBudget(model.base_url, 8, connect=connect_to(dsn))
    result = run(spec, dsn, doc_ids)
    assert sorted(result.done) == doc_ids
    stats = model.stats()
    assert stats["requests"] > 10
    assert stats["peak_in_flight"] == 2
    paid_once(model, conn)


def test_the_provider_never_sees_more_requests_a_second_than_max_rps(conn, dsn, model):
    """Three workers with four threads each share one budget of 20 requests a second: by any
    moment, the provider has received no more than 20 a second since the first was reserved."""
    doc_ids = seed_documents(conn, 12)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    model.set_faults(latency_ms=5)
    rate, results, asked = 20.0, [], []

    def worker(part, n):
        spec = embed_spec(model.base_url, dsn, in_flight=4, per_call=2, rps=rate)
        reserve = spec.budget.reserve

        def noted(tokens: int = 0) -> float:
            asked.append(time.monotonic())
            return reserve(tokens)

        spec.budget.reserve = noted
        try:
            results.append(run(spec, dsn, part, owner=f"w{n}"))
        finally:
            spec.budget.close()

    on_workers(worker, [doc_ids[0::3], doc_ids[1::3], doc_ids[2::3]])
    # The provider's own clock says when each request arrived. Windows between two arrivals
    # would also count requests a loaded machine held back past their send times and then
    # let go together; counted from the first reservation, a late request is never a burst.
    arrivals = model.arrivals()
    ahead = arrivals_ahead(arrivals, rate, since=min(asked))
    span = max(arrivals) - min(asked)
    print(
        f"\n{len(arrivals)} requests in {span:.2f} s from the first reservation; {ahead:.2f} ahead"
    )
    assert len(arrivals) >= 40  # enough for the rate to bind
    # The first request may go at once; a twentieth of a request for the two clocks (Postgres
    # spaces the send times on its own, the provider stamps arrivals on the monotonic one).
    assert ahead <= 1.05
    assert sum(len(r.done) for r in results) == len(doc_ids)
    paid_once(model, conn)


TPM = 240_000  # 4,000 tokens a second


TPM_WINDOW_S = 0.5  # the provider's bucket: 2,000 tokens, half a second of the limit


def _embed_under_tpm(model, dsn, parts, *, max_tpm):
    """Embed each part on its own worker (a thread with its own budget and sessions), all
    starting together."""
    results, spans = [], []
    together = threading.Barrier(len(parts), timeout=30)

    def worker(part, n):
        spec = embed_spec(model.base_url, dsn, in_flight=4, per_call=4)
        spec.budget = RequestBudget(
            model.base_url, 4, max_tpm=max_tpm, connect=connect_to(dsn), tokens_tolerance_s=0.2
        )
        together.wait()
        started = time.monotonic()
        try:
            results.append(run(spec, dsn, part, owner=f"w{n}"))
        finally:
            spans.append((started, time.monotonic()))
            spec.budget.close()

    on_workers(worker, parts)
    return results, spans


def test_two_workers_share_the_tokens_per_minute_and_cause_no_429(conn, dsn, model):
    """Two workers spend one max_tpm against a provider that enforces it over half a second.

    With the budget, the provider refuses nothing and charges each chunk once, though the
    work is more than the provider's bucket; without it, a burst goes past the provider's
    limit (so the limit is enforced where the test looks).
    """
    doc_ids = seed_documents(conn, 12)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    model.set_faults(max_tpm=TPM, tpm_window_s=TPM_WINDOW_S)
    results, spans = _embed_under_tpm(model, dsn, [doc_ids[0::2], doc_ids[1::2]], max_tpm=TPM)
    stats = model.stats()
    assert sorted(d for r in results for d in r.done) == doc_ids
    # They overlapped: started together, neither ended before the other began.
    assert max(start for start, _ in spans) < min(end for _, end in spans)
    assert stats["rejected_tpm"] == 0, stats
    # More than the provider's bucket was spent, so the rate, not the burst, carried it.
    assert stats["tokens_charged"] > 2 * TPM / 60 * TPM_WINDOW_S
    assert set(stats["input_success_counts"].values()) == {1}  # each chunk charged once
    assert set(stats["input_success_counts"]) == chunk_digests(conn, doc_ids)

    # Without the budget: eight requests of a thousand tokens, let go together, are four
    # buckets' worth; to pass, the last would have to arrive 1.5 s after the first, which
    # no loaded machine stretches eight threads' sends to.
    model.set_faults(max_tpm=TPM, tpm_window_s=TPM_WINDOW_S)
    model.reset_stats()
    together = threading.Barrier(8, timeout=30)

    def unbudgeted(n: int) -> int:
        together.wait()
        text = " ".join(f"w{n}-{i}" for i in range(1000))  # the server counts words as tokens
        body = {"model": "m", "input": text}
        return httpx.post(f"{model.base_url}/embeddings", json=body, timeout=30).status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(unbudgeted, range(8)))
    assert 429 in statuses and model.stats()["rejected_tpm"] > 0


class _BudgetWhoseCorrectionFails(RequestBudget):
    def refund(self, reserved: int, used: int) -> None:
        raise RuntimeError("the budget's connection is gone")


def test_an_answer_paid_for_is_stored_when_the_token_correction_fails(conn, dsn, model):
    """Correcting the token budget comes after the answer is kept: a failure there costs
    the budget its correction, never a second charge or the document's outcome."""
    doc_ids = seed_documents(conn, 1)
    run(ChunkSpec(config=CHUNKS, connect=connect_to(dsn)), dsn, doc_ids)
    spec = embed_spec(model.base_url, dsn, per_call=100)
    spec.budget = _BudgetWhoseCorrectionFails(
        model.base_url, 4, max_tpm=6_000_000, connect=connect_to(dsn)
    )
    try:
        result = run(spec, dsn, doc_ids)
    finally:
        spec.budget.close()
    assert result.done == doc_ids
    assert model.stats()["requests"] == 1
    paid_once(model, conn)
