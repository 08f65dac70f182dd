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
EXPECTED_ALERTS = {"TxmqCheckLagHigh", "TxmqCheckDueUndelivered", "TxmqTransactionsDiscarded",
                   "TxmqPendingTransactionsGrowing", "TxmqBrokerDown", "TxmqBrokersMissing",
                   "TxmqProxiesMissing", "TxmqAuditAnomalies"}


def _rules(rendered: dict[str, Rendered]) -> dict[str, Any]:
    (rule,) = rendered["ha-monitoring"].of_kind("PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def _promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_promtool_checks_the_rendered_rules(promtool: Path, rendered: dict[str, Rendered], tmp_path: Path) -> None:
    rules = _rules(rendered)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    proc = _promtool(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert alerts == EXPECTED_ALERTS
    assert f"SUCCESS: {len(alerts)} rules found" in proc.stdout


def _unit_test(promtool: Path, rules: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(HERE / "alerts_test.yaml", tmp_path / "alerts_test.yaml")
    return _promtool(promtool, "test", "rules", "alerts_test.yaml", cwd=tmp_path)


def test_promtool_unit_tests_fire_the_expected_alerts(promtool: Path, rendered: dict[str, Rendered],
                                                       tmp_path: Path) -> None:
    proc = _unit_test(promtool, _rules(rendered), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = {t["alertname"] for case in yaml.safe_load((HERE / "alerts_test.yaml").read_text())["tests"]
              for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == EXPECTED_ALERTS, "every alert has a case where it fires"


@pytest.mark.parametrize("alert", ["TxmqBrokerDown", "TxmqPendingTransactionsGrowing", "TxmqAuditAnomalies"])
def test_unit_tests_fail_when_a_rule_breaks(promtool: Path, rendered: dict[str, Rendered], tmp_path: Path,
                                            alert: str) -> None:
    rules = _rules(rendered)
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(0) > 1"
    proc = _unit_test(promtool, rules, tmp_path)
    assert proc.returncode != 0
    assert alert in proc.stdout + proc.stderr
