"""What a run's model calls cost (ADR 0110), against the local model server's own counts.

The server charges a request once: a replay under the same Idempotency-Key (after an
answer was lost on its way back) is served from memory and not charged. The ledger must
cost what was charged, at the connection's prices, and nothing twice.
"""

from __future__ import annotations

import json
import os

import pytest

import corpus
from checks import rows, scrape_metrics, subset
from replayable.pipeline import format_report
from replayable.vocabulary import DEFAULT_STAGES

EMBED_PRICE = 0.02  # USD per million tokens, as OpenAI lists text-embedding-3-small
CHAT_IN, CHAT_OUT = 0.15, 0.60  # gpt-4o-mini


@pytest.fixture
def priced(monkeypatch):
    """Set the model connection's extra ``prices`` (the run_in_process fixture has put the
    connection in the environment first)."""

    def set_prices(prices: dict) -> None:
        connection = json.loads(os.environ["AIRFLOW_CONN_REPLAYABLE_MODEL"])
        connection["extra"] = {**connection.get("extra", {}), "prices": prices}
        monkeypatch.setenv("AIRFLOW_CONN_REPLAYABLE_MODEL", json.dumps(connection))

    return set_prices


def test_a_runs_cost_is_what_the_provider_charged_at_the_connections_prices(
    run_in_process, priced, conn, model, tmp_path
):
    priced({"text-embedding-3-small": {"input": EMBED_PRICE}})
    model.set_faults(lose_response_rate=0.4, seed=7)
    report = run_in_process({"source": str(subset(tmp_path, 6)), "batch_size": 3})
    assert not report["_failed"], report["_tasks"]
    stats = model.stats()
    assert stats["lost_responses"] > 0 and stats["deduplicated"] > 0  # answers were replayed
    cost = report["cost"]
    assert cost["usd"] == pytest.approx(stats["tokens_charged"] * EMBED_PRICE / 1e6, rel=1e-9)
    assert cost["unpriced_calls"] == 0
    ((entry),) = cost["by_model"]
    assert (entry["model"], entry["mode"], entry["calls"]) == (
        "text-embedding-3-small",
        "sync",
        stats["charged"],
    )
    assert entry["input_tokens"] == stats["tokens_charged"]
    assert "cost: $" in format_report(report)


def test_a_chat_answer_is_costed_by_its_prompt_and_completion_prices(
    run_in_process, priced, conn, model, tmp_path
):
    priced(
        {
            "text-embedding-3-small": {"input": EMBED_PRICE},
            "gpt-4o-mini": {"input": CHAT_IN, "output": CHAT_OUT},
        }
    )
    folder = subset(tmp_path, 4)
    assert not run_in_process({"source": str(folder)})["_failed"]
    model.reset_stats()
    report = run_in_process({"source": str(folder), "stages": [*DEFAULT_STAGES, "summarize"]})
    assert not report["_failed"], report["_tasks"]
    stats = model.stats()
    assert stats["chat_charged"] == stats["charged"] > 0  # only the summaries were paid
    ((chat),) = report["cost"]["by_model"]
    assert chat["model"] == "gpt-4o-mini"
    assert chat["input_tokens"] + chat["output_tokens"] == stats["tokens_charged"]
    assert chat["output_tokens"] > 0
    assert chat["usd"] == pytest.approx(
        (chat["input_tokens"] * CHAT_IN + chat["output_tokens"] * CHAT_OUT) / 1e6, rel=1e-9
    )


def test_a_model_with_no_price_is_unpriced_not_free(run_in_process, priced, conn, model, tmp_path):
    priced({})
    report = run_in_process({"source": str(subset(tmp_path, 3))})
    assert not report["_failed"], report["_tasks"]
    cost = report["cost"]
    assert cost["usd"] == 0
    assert cost["unpriced_calls"] == model.stats()["charged"] > 0
    assert rows(conn, "SELECT DISTINCT cost_usd FROM replayable.model_calls") == [(None,)]
    assert "unpriced" in format_report(report)


def test_the_cost_metric_adds_up_every_runs_cost_by_model_and_mode(
    run_in_process, priced, conn, dsn, model, tmp_path, monkeypatch
):
    priced({"text-embedding-3-small": {"input": EMBED_PRICE}})
    first = run_in_process({"source": str(subset(tmp_path, 3))})
    second = run_in_process({"source": str(subset(tmp_path, 5))})  # two more documents
    scraped = scrape_metrics(dsn, monkeypatch)
    labels = (("mode", "sync"), ("model", "text-embedding-3-small"))
    assert scraped["replayable_model_cost_total", labels] == pytest.approx(
        first["cost"]["usd"] + second["cost"]["usd"], rel=1e-9
    )
    assert scraped["replayable_model_unpriced_calls_total", labels] == 0


def test_an_identical_rerun_costs_nothing(run_in_process, priced, conn, model, tmp_path):
    priced({"text-embedding-3-small": {"input": EMBED_PRICE}})
    folder = subset(tmp_path, 3)
    assert run_in_process({"source": str(folder)})["cost"]["usd"] > 0
    again = run_in_process({"source": str(folder)})
    assert again["cost"] == {"usd": 0, "unpriced_calls": 0, "by_model": []}


def test_a_refused_answer_is_billed_and_costed_like_any_answer(
    run_in_process, priced, conn, model, tmp_path
):
    """A refusal comes back 200 with its usage: the provider charges it, so the run's cost
    counts it, and the 30 days' counters too (ADR 0114)."""
    priced({"gpt-4o-mini": {"input": CHAT_IN, "output": CHAT_OUT}})
    folder = subset(tmp_path, 2)
    corpus.write_pdf(folder / "refused.pdf", ["Nobody may summarise the FORBIDDEN-TOPIC memo."])
    assert not run_in_process({"source": str(folder)})["_failed"]
    model.reset_stats()
    model.set_faults(chat_refusal_containing="FORBIDDEN-TOPIC")
    report = run_in_process({"source": str(folder), "stages": [*DEFAULT_STAGES, "summarize"]})
    assert not report["_failed"], report["_tasks"]
    assert report["stages"]["summarize"]["dead"] == 1
    stats = model.stats()
    assert stats["chat_charged"] == stats["charged"] == 3  # the refusal was charged
    ((chat),) = report["cost"]["by_model"]
    assert chat["calls"] == 3
    assert chat["input_tokens"] + chat["output_tokens"] == stats["tokens_charged"]
    assert chat["usd"] == pytest.approx(
        (chat["input_tokens"] * CHAT_IN + chat["output_tokens"] * CHAT_OUT) / 1e6, rel=1e-9
    )
    refused = rows(
        conn,
        "SELECT status, tokens > 0, cost_usd > 0 FROM replayable.model_calls"
        " WHERE stage = 'summarize' AND status <> 'ok'",
    )
    assert refused == [("refused", True, True)]
    counted = rows(
        conn,
        "SELECT sum(calls)::int, sum(input_tokens + output_tokens)::int"
        " FROM replayable.model_cost_counts WHERE model = 'gpt-4o-mini'",
    )
    assert counted == [(3, stats["tokens_charged"])]
