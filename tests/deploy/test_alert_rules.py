"""deploy/prometheus's alert rules: valid for promtool, unit-tested by alerts.test.yml, on real series.

`promtool` ships in Debian's `prometheus` package (`make deps` installs it; without it these
tests fail with the install command). The dashboard's queries are run against a real Prometheus
scraping a real run in tests/e2e/service/test_dashboard.py.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import yaml

from tests.conftest import REPO
from tests.deps import require

PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "alerts.yml"
RULE_TESTS = PROMETHEUS / "alerts.test.yml"
SOURCES = ("sdk/procmesh", "orchestrator/procmesh_orchestrator")

ALERTS = {
    # What issue 27 asks to be alerted on, and the rule that does it.
    "processor failure rate": "ProcmeshProcessorFailureRate",
    "failures let through by fail-open": "ProcmeshFailuresLetThrough",
    "tripwires spike": "ProcmeshTripwireSpike",
    "p99 hook latency": "ProcmeshHookLatencyP99High",
    "sidecar down": "ProcmeshSidecarDown",
    "durable lease renewals failing": "ProcmeshLeaseRenewalsFailing",
    "event-log lag": "ProcmeshEventLogLag",
    "cost limit hits": "ProcmeshCostLimitHit",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require("promtool"), *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120, check=False
    )


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules_and_the_config_that_loads_them() -> None:
    checked = promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout
    config = promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr
    assert RULES.name in yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["rule_files"]


def test_the_rules_unit_tests_pass() -> None:
    tested = promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_rule_is_unit_tested_firing_and_each_asked_for_alert_exists() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    fired = {
        case["alertname"]
        for test in doc["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    names = [rule["alert"] for rule in rules()]
    assert sorted(set(names)) == sorted(names), "an alert name is used twice"
    assert sorted(set(names) - fired) == []
    assert sorted(set(ALERTS.values()) - set(names)) == []


def test_the_rules_read_only_series_procmesh_exports() -> None:
    source = "\n".join(
        p.read_text(encoding="utf-8") for folder in SOURCES for p in (REPO / folder).rglob("*.py")
    )
    used = set()
    for rule in rules():
        used |= {
            re.sub(r"_(bucket|count|sum)$", "", m) for m in re.findall(r"\bprocmesh_[a-z_]+", rule["expr"])
        }
    assert used
    assert sorted(name for name in used if f'"{name}"' not in source) == []


def test_every_alert_says_where_to_read_what_to_do() -> None:
    for rule in rules():
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), rule["alert"]
        assert rule["annotations"]["runbook"] == "docs/operations.md#alerts"
    assert "### Alerts" in (REPO / "docs" / "operations.md").read_text(encoding="utf-8")


def test_the_servicemonitor_gives_its_targets_the_job_names_the_rules_select() -> None:
    monitor = yaml.safe_load(
        (REPO / "deploy" / "k8s" / "components" / "servicemonitor" / "servicemonitor.yaml").read_text()
    )
    jobs = {
        endpoint["port"]: [
            r["replacement"] for r in endpoint.get("relabelings", []) if r["targetLabel"] == "job"
        ]
        for endpoint in monitor["spec"]["endpoints"]
    }
    assert jobs == {
        "http": ["procmesh-orchestrator"],
        "metrics-builtins": ["procmesh-sidecars"],
        "metrics-guards": ["procmesh-sidecars"],
    }
    scrape = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert {job["job_name"] for job in scrape["scrape_configs"]} == {j for js in jobs.values() for j in js}
    selected = set(re.findall(r'job="([\w-]+)"', RULES.read_text()))
    assert selected == {"procmesh-orchestrator", "procmesh-sidecars"}
