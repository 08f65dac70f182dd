"""The chart's alert rules through Debian's promtool: `promtool check rules` on the rendered
PrometheusRule, and `promtool test rules` with alerts_test.yaml feeding series and asserting
which alerts fire (and which must not)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .chart import Rendered

HERE = Path(__file__).resolve().parent
EXPECTED_ALERTS = {"TxmqCheckLagHigh", "TxmqCheckDueUndelivered", "TxmqChecksWaitingForProducers",
                   "TxmqCheckAnswersRefused", "TxmqTransactionsDiscarded", "TxmqGlobalDecisionUndelivered",
                   "TxmqPendingTransactionsGrowing", "TxmqBrokerDown", "TxmqBrokersMissing",
                   "TxmqProxiesMissing", "TxmqShardAvoided", "TxmqAuditAnomalies",
                   "TxmqConsumerLagHigh", "TxmqDeadLetters", "TxmqBrokerDiskLow"}
#: Rendered only for replicated shards (ci/replicated-values.yaml), tested by
#: replication_alerts_test.yaml.
REPLICATION_ALERTS = {"TxmqShardWithoutLeader", "TxmqShardUnderReplicated", "TxmqShardInsyncShrinking",
                      "TxmqWritesRefused"}
UNIT_TESTS = {"ha-monitoring": "alerts_test.yaml", "replicated": "replication_alerts_test.yaml"}


def _rules(rendered: dict[str, Rendered], scenario: str = "ha-monitoring") -> dict[str, Any]:
    (rule,) = rendered[scenario].of_kind("PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def _promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("scenario", "expected"), [("ha-monitoring", EXPECTED_ALERTS),
                                                     ("replicated", EXPECTED_ALERTS | REPLICATION_ALERTS)])
def test_promtool_checks_the_rendered_rules(promtool: Path, rendered: dict[str, Rendered], tmp_path: Path,
                                            scenario: str, expected: set[str]) -> None:
    rules = _rules(rendered, scenario)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    proc = _promtool(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert alerts == expected
    assert f"SUCCESS: {len(alerts)} rules found" in proc.stdout
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["alert"] in REPLICATION_ALERTS:
                assert "shard" in rule["expr"] and rule.get("for"), rule["alert"]


def _unit_test(promtool: Path, rules: dict[str, Any], tmp_path: Path,
               scenario: str = "ha-monitoring") -> subprocess.CompletedProcess[str]:
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(HERE / UNIT_TESTS[scenario], tmp_path / UNIT_TESTS[scenario])
    return _promtool(promtool, "test", "rules", UNIT_TESTS[scenario], cwd=tmp_path)


@pytest.mark.parametrize(("scenario", "expected"), [("ha-monitoring", EXPECTED_ALERTS),
                                                     ("replicated", REPLICATION_ALERTS | {"TxmqBrokersMissing"})])
def test_promtool_unit_tests_fire_the_expected_alerts(promtool: Path, rendered: dict[str, Rendered],
                                                       tmp_path: Path, scenario: str, expected: set[str]) -> None:
    proc = _unit_test(promtool, _rules(rendered, scenario), tmp_path, scenario)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = {t["alertname"] for case in yaml.safe_load((HERE / UNIT_TESTS[scenario]).read_text())["tests"]
              for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == expected, "every alert has a case where it fires"


@pytest.mark.parametrize(("scenario", "alert"), [
    ("ha-monitoring", "TxmqBrokerDown"), ("ha-monitoring", "TxmqPendingTransactionsGrowing"),
    ("ha-monitoring", "TxmqAuditAnomalies"), ("ha-monitoring", "TxmqConsumerLagHigh"),
    ("ha-monitoring", "TxmqDeadLetters"), ("ha-monitoring", "TxmqBrokerDiskLow"),
    *[("replicated", a) for a in sorted(REPLICATION_ALERTS)]])
def test_unit_tests_fail_when_a_rule_breaks(promtool: Path, rendered: dict[str, Rendered], tmp_path: Path,
                                            scenario: str, alert: str) -> None:
    rules = _rules(rendered, scenario)
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(0) > 1"
    proc = _unit_test(promtool, rules, tmp_path, scenario)
    assert proc.returncode != 0
    assert alert in proc.stdout + proc.stderr
