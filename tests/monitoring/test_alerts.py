"""monitoring/alerts.yml: promtool checks and unit-tests the rules; their metrics exist.

promtool comes from Debian's prometheus package through monitoring/install-promtool.sh. The
tests skip only where apt itself is missing; any other failure to get promtool fails them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from monitoring_checks import MONITORING, install_promtool, run

from replayable.web.metrics import METRIC_NAMES

RULES = MONITORING / "alerts.yml"
RULE_TESTS = MONITORING / "alerts.test.yml"
METRIC = re.compile(r"\breplayable_[a-z_]+\b")


@pytest.fixture(scope="module")
def promtool() -> Path:
    return install_promtool()


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_accepts_the_rules(promtool: Path) -> None:
    assert f"SUCCESS: {len(rules())} rules found" in run(promtool, "check", "rules", RULES.name)


def test_the_outbox_has_a_backlog_rule_and_a_dead_event_rule() -> None:
    names = {rule["alert"] for rule in rules()}
    assert {"ReplayableOutboxBacklog", "ReplayableOutboxDeadEvents"} <= names


def test_the_rule_unit_tests_pass(promtool: Path) -> None:
    assert "SUCCESS" in run(promtool, "test", "rules", RULE_TESTS.name)


def test_every_metric_the_rules_use_is_one_the_endpoint_exports() -> None:
    used = {name for rule in rules() for name in METRIC.findall(rule["expr"])}
    assert used
    assert used <= METRIC_NAMES, used - METRIC_NAMES


def test_the_rule_tests_feed_only_exported_series() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    series = {s["series"].split("{")[0] for t in tests for s in t["input_series"]}
    assert series <= METRIC_NAMES, series - METRIC_NAMES


def test_every_rule_has_a_firing_case_and_a_quiet_case() -> None:
    """Quiet means: an evaluation that expects no alert, or a stage fed but not alerted.

    Rules over the whole outbox have no stage: an evaluation expecting none is their quiet case.
    """
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests:
        fed = {
            m.group(1)
            for s in case["input_series"]
            for m in [re.search(r'stage="(\w+)"', s["series"])]
            if m
        }
        for check in case["alert_rule_test"]:
            if check["exp_alerts"]:
                firing.add(check["alertname"])
            alerted = {a["exp_labels"].get("stage") for a in check["exp_alerts"]}
            if not check["exp_alerts"] or fed - alerted:
                quiet.add(check["alertname"])
    names = {rule["alert"] for rule in rules()}
    assert firing == names
    assert quiet == names


def test_the_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in METRIC.findall(target["expr"])
    }
    assert used
    assert used <= METRIC_NAMES, used - METRIC_NAMES
