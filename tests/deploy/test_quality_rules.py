"""The quality alert rules: Prometheus's file checked and unit-tested by promtool, Grafana's
provisioned twin held to it.

`promtool test rules` runs telemetry/rerank-quality.rules.test.yml, whose cases include a
reranker that returns recall's order (tau = 1 on every call): the "stopped reordering" alert
must fire on it and stay quiet on a healthy reranker and on a trickle of calls.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "telemetry" / "rerank-quality.rules.yml"
RULE_TESTS = ROOT / "telemetry" / "rerank-quality.rules.test.yml"
GRAFANA_ALERTS = ROOT / "grafana" / "provisioning" / "alerting" / "rerank-quality.yaml"
PROMETHEUS = ROOT / "telemetry" / "prometheus.yml"

ALERTS = {"RerankerStoppedReordering", "RerankerScoreCollapse"}


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return YAML(typ="safe", pure=True).load(f)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not on PATH (Debian package `prometheus`)")
    return subprocess.run(
        [found, *args], capture_output=True, text=True, timeout=120, check=False, cwd=ROOT
    )


def prometheus_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(RULES)["groups"] for rule in group["rules"]]


def squash(expr: str) -> str:
    return " ".join(expr.split())


def test_the_rules_file_is_valid() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_pass_an_identity_reranker_fires() -> None:
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr
    tests = load_yaml(RULE_TESTS)["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    assert fired == ALERTS  # each alert has a case where it fires...
    quiet = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if not case["exp_alerts"]
    }
    assert quiet == ALERTS  # ...and one where it must not


def test_the_unit_tests_can_fail(tmp_path: Path) -> None:
    # The identity reranker's expected alert, with its threshold raised past 1, must go red.
    broken = RULES.read_text(encoding="utf-8").replace(
        "retrieval_stage_rerank_unchanged:ratio30m > 0.9",
        "retrieval_stage_rerank_unchanged:ratio30m > 1",
    )
    assert broken != RULES.read_text(encoding="utf-8")
    (tmp_path / RULES.name).write_text(broken, encoding="utf-8")
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text(encoding="utf-8"), "utf-8")

    done = promtool("test", "rules", str(tmp_path / RULE_TESTS.name))

    assert done.returncode != 0
    assert "RerankerStoppedReordering" in done.stdout + done.stderr


def test_prometheus_loads_the_rules_file() -> None:
    config = load_yaml(PROMETHEUS)
    assert RULES.name in config.get("rule_files", [])
    assert (PROMETHEUS.parent / RULES.name).is_file()


def test_grafana_alerts_are_the_prometheus_alerts() -> None:
    alerts = {rule["alert"]: rule for rule in prometheus_rules() if "alert" in rule}
    recorded = {rule["record"] for rule in prometheus_rules() if "record" in rule}
    (group,) = load_yaml(GRAFANA_ALERTS)["groups"]
    grafana = {rule["title"]: rule for rule in group["rules"]}

    assert set(alerts) == ALERTS
    assert set(grafana) == ALERTS
    assert group["folder"] == "Retrieval stage"  # the dashboards' folder
    for name, rule in grafana.items():
        query = next(d for d in rule["data"] if d["refId"] == "A")
        threshold = next(d for d in rule["data"] if d["refId"] == rule["condition"])
        assert query["datasourceUid"] == "prometheus"
        assert threshold["model"]["expression"] == "A"
        (condition,) = threshold["model"]["conditions"]
        assert condition["evaluator"]["type"] == "gt"
        (limit,) = condition["evaluator"]["params"]
        # Prometheus's `X > limit and on (...) Y` is Grafana's query `X and on (...) Y`, then
        # the threshold `> limit`.
        expected = squash(alerts[name]["expr"]).replace(f" > {limit} ", " ", 1)
        assert squash(query["model"]["expr"]) == expected, name
        assert rule["for"] == alerts[name]["for"]
        assert rule["labels"] == alerts[name]["labels"]
        assert rule["noDataState"] == "OK"  # no traffic is not an incident
        for series in re.findall(r"[a-z_]+:[a-z_0-9]+:[a-z_0-9]+", query["model"]["expr"]):
            assert series in recorded, f"{name}: {series} is not recorded by Prometheus"
