"""The outbox chaos scenario (j) end to end, short of Airflow: a real receiver down for 20
publish rounds, then back; each round scraped by the metrics endpoint's own renderer, and
the scrapes fed to promtool against monitoring/alerts.yml (ADR 0070, 0072)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from monitoring_checks import MONITORING, install_promtool, run
from prometheus_client.parser import text_string_to_metric_families

from publishers import add_events
from replayable import db
from replayable.airflow.sinks import WebhookSettings, WebhookSink
from replayable.outbox import PublishLimits, publish
from replayable.retry import CallRetry
from replayable.web.metrics import render

pytestmark = pytest.mark.db

ROUNDS_DOWN = 20
ROUND_MIN = 10  # outbox_publisher's schedule: one round every 10 minutes
EVENTS = 30
LIMITS = PublishLimits(claim_size=10, lease_s=30.0, max_attempts=3, backoff_base_s=0.0)
BACKLOG = "ReplayableOutboxBacklog"


@pytest.fixture(scope="module")
def promtool() -> Path:
    return install_promtool()


def scrape(dsn: str) -> dict[str, float]:
    """The outbox samples of one scrape, as PromQL names them."""
    reader = db.connect(dsn)
    try:
        reader.set_session(readonly=True, autocommit=True)
        text, _ = render(reader)
    finally:
        reader.close()
    found = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name.startswith("replayable_outbox_"):
                status = sample.labels.get("status")
                found[f'{sample.name}{{status="{status}"}}' if status else sample.name] = (
                    sample.value
                )
    return found


def series(rounds: list[dict[str, float]]) -> list[dict[str, Any]]:
    """promtool input series: each round's scrape repeated once a minute until the next."""
    names = sorted(rounds[0])
    return [
        {
            "series": name,
            "values": " ".join(f"{r[name]:g}x{ROUND_MIN - 1}" for r in rounds),
        }
        for name in names
    ]


def test_a_receiver_down_for_twenty_rounds_kills_no_event_fires_the_alert_and_drains(
    conn, dsn, model, tmp_path, promtool
):
    add_events(conn, EVENTS)
    database = db.Database(dsn)
    retry = CallRetry(max_attempts=2, max_total_s=5.0, base_s=0.01, cap_s=0.05)
    rounds: list[dict[str, float]] = []
    try:
        with WebhookSink(
            WebhookSettings(model.webhook_url("j"), timeout_s=5.0, retry=retry)
        ) as hook:
            model.set_faults(webhook_status_always=503)
            for n in range(ROUNDS_DOWN):
                publish(database, hook, owner="p", publication=f"down-{n}", limits=LIMITS)
                rounds.append(scrape(dsn))
            model.clear_faults()
            for n in range(6):  # an hour of rounds after it
                publish(database, hook, owner="p", publication=f"up-{n}", limits=LIMITS)
                rounds.append(scrape(dsn))
    finally:
        database.close()

    down, up = rounds[ROUNDS_DOWN - 1], rounds[-1]
    assert down['replayable_outbox_events{status="pending"}'] == EVENTS
    assert down['replayable_outbox_events{status="dead"}'] == 0
    assert up['replayable_outbox_events{status="pending"}'] == 0
    assert up['replayable_outbox_events{status="dead"}'] == 0
    assert up["replayable_outbox_dead_lettered_total"] == 0
    assert up["replayable_outbox_published_total"] == EVENTS
    assert len(model.webhook_events("j")) == EVENTS

    backlog_rule = next(
        rule
        for group in yaml.safe_load((MONITORING / "alerts.yml").read_text())["groups"]
        for rule in group["rules"]
        if rule["alert"] == BACKLOG
    )
    mid_outage = ROUNDS_DOWN * ROUND_MIN // 2
    after = (ROUNDS_DOWN + 5) * ROUND_MIN
    case = {
        "rule_files": [str(MONITORING / "alerts.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series(rounds),
                "alert_rule_test": [
                    {
                        "eval_time": f"{mid_outage}m",
                        "alertname": BACKLOG,
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning"},
                                "exp_annotations": {
                                    "summary": f"Replayable outbox: {EVENTS} events wait, "
                                    "none delivered for 30 minutes",
                                    "description": backlog_rule["annotations"]["description"],
                                },
                            }
                        ],
                    },
                    {"eval_time": f"{after}m", "alertname": BACKLOG, "exp_alerts": []},
                    {
                        "eval_time": f"{after}m",
                        "alertname": "ReplayableOutboxDeadEvents",
                        "exp_alerts": [],
                    },
                ],
            }
        ],
    }
    (tmp_path / "outage.test.yml").write_text(yaml.safe_dump(case))
    run(promtool, "test", "rules", "outage.test.yml", cwd=tmp_path)
