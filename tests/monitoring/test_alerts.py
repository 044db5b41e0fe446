"""monitoring/alerts.yml: promtool checks and unit-tests the rules; their metrics exist.

promtool comes from Debian's prometheus package through monitoring/install-promtool.sh. The
tests skip only where apt itself is missing; any other failure to get promtool fails them.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import ROOT
from replayable.web.metrics import METRIC_NAMES

MONITORING = ROOT / "monitoring"
RULES = MONITORING / "alerts.yml"
RULE_TESTS = MONITORING / "alerts.test.yml"
METRIC = re.compile(r"\breplayable_[a-z_]+\b")


@pytest.fixture(scope="module")
def promtool() -> Path:
    done = subprocess.run(
        [str(MONITORING / "install-promtool.sh")],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode == 2:
        pytest.skip(f"apt is not available to install promtool: {done.stderr.strip()}")
    assert done.returncode == 0, f"could not install promtool:\n{done.stderr}"
    return Path(done.stdout.strip().splitlines()[-1])


def run(promtool: Path, *args: str) -> str:
    done = subprocess.run(
        [str(promtool), *args], cwd=MONITORING, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def test_promtool_accepts_the_rules(promtool: Path) -> None:
    assert "SUCCESS: 4 rules found" in run(promtool, "check", "rules", RULES.name)


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
    """Quiet means: an evaluation that expects no alert, or a stage fed but not alerted."""
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
            alerted = {a["exp_labels"]["stage"] for a in check["exp_alerts"]}
            if alerted:
                firing.add(check["alertname"])
            if fed - alerted:
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
