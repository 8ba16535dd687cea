"""deploy/grafana/procmesh.json against a real Prometheus scraping a real run: every panel has data.

A real orchestrator with two real sidecars (the `examples` sidecar with its metrics port, and
the failure tests' `faulty` one) runs a few calls: a clean run, a tripwire, a step retry, a
fail-open failure beside a guard in `mode: monitor`, and a cost limit hit. Prometheus scrapes
both targets every second with deploy/prometheus/prometheus.yml (its alert rules loaded too);
once the series are in, each panel's query is sent to /api/v1/query with the dashboard's
variables as Grafana's "All" sends them (`.*`) and `$__rate_interval` as 5m (the runs are
seconds old), and must return at least one series. So must each template variable's
`label_values` query.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.deps import require
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.test_prometheus import (
    ORCHESTRATOR_JOB,
    SIDECAR_JOB,
    Prometheus,
    examples_with_metrics,
    running_prometheus,
)
from tests.integration.service.support import API_KEYS, AUTH, service_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

DASHBOARD = REPO / "deploy" / "grafana" / "procmesh.json"
VARIABLES = {"$agent": ".*", "$sidecar": ".*", "$processor": ".*", "$__rate_interval": "5m"}
SCRAPE_WAIT = 60.0
"""Bounds the wait for Prometheus to have every series (it scrapes every second)."""


def panels() -> list[dict[str, Any]]:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [p for p in doc["panels"] if p["type"] != "row"]


def as_sent(expr: str) -> str:
    """The query Grafana sends with every variable at "All" (its allValue `.*`)."""
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, expr
    return expr


def config(guards: str, faulty: str, db: str) -> dict[str, Any]:
    """The service tests' agents, plus `rollout` (a fail-open failure and a guard in mode monitor)
    and `budgeted` (a cost limit its second run hits)."""
    cfg = service_config({"guards": guards, "faulty": faulty})
    cfg["storage"] = {"path": db}
    cfg["prices"] = {"demo": {"input": 1000.0, "output": 1000.0}}
    cfg["agents"]["rollout"] = {
        "model": "demo",
        "errorProcessorDefaults": False,
        "inputProcessors": [
            {"processor": "faulty/raiser", "onFailure": "fail-open"},
            {"processor": "guards/topic-guard", "options": {"words": ["jailbreak"]}, "mode": "monitor"},
        ],
    }
    cfg["agents"]["budgeted"] = {
        "model": "demo",
        "errorProcessorDefaults": False,
        "costControl": {"maxCost": 0.01, "scope": "agent", "reserveOutputTokens": 1},
    }
    return cfg


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def prometheus(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Prometheus]:
    guards, metrics_port = examples_with_metrics(start_sidecar, "dash-guards")
    faulty = start_sidecar(name="dash-faulty", module="tests.fixtures.faulty")
    await asyncio.gather(guards.wait_ready(), faulty.wait_ready())
    workdir = tmp_path_factory.mktemp("dashboard")
    binary = require("prometheus")
    orchestrator = await asyncio.to_thread(
        start_orchestrator,
        config(guards.address, faulty.address, str(workdir / "memory.db")),
        env={"PROCMESH_API_KEYS": API_KEYS},
    )
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http:
        calls = [
            ("assistant", "hello"),  # ok, through word-filter's output stream
            ("assistant", "jailbreak please"),  # tripwire in process_input
            ("concise", "hello"),  # length-check asks for a retry once
            ("rollout", "jailbreak please"),  # raiser fails open; the monitor would have aborted
            ("budgeted", "hello"),  # admitted, and spends past the limit
            ("budgeted", "hello"),  # refused: the cost limit is hit
        ]
        for agent, text in calls:
            response = await http.post(f"/api/agents/{agent}/generate", json={"messages": text})
            assert response.status_code == 200, response.text
    async with running_prometheus(binary, orchestrator, metrics_port, workdir, SCRAPE_WAIT) as (
        server,
        deadline,
    ):
        # rate() needs two samples of a series: wait for the third scrape of both targets.
        thrice = f'count_over_time(up{{job=~"{ORCHESTRATOR_JOB}|{SIDECAR_JOB}"}}[1m]) >= 3'
        while len(await server.query(thrice)) < 2:
            assert time.monotonic() < deadline, "no third scrape in time"
            await asyncio.sleep(0.5)
        yield server


async def test_every_panel_query_returns_data(prometheus: Prometheus) -> None:
    empty = []
    queried = 0
    for panel in panels():
        for target in panel["targets"]:
            queried += 1
            if not await prometheus.query(as_sent(target["expr"])):
                empty.append(f"{panel['title']}: {target['expr']}")
    assert queried >= 20
    assert empty == []


async def test_every_template_variable_has_values(prometheus: Prometheus) -> None:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = {}
    for variable in doc["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
        assert match, variable["definition"]
        series = await prometheus.labels(as_sent(match[1]))
        found[variable["name"]] = sorted({s[match[2]] for s in series if match[2] in s})
    assert found["agent"] == ["assistant", "budgeted", "concise", "rollout"]
    assert found["sidecar"] == ["faulty", "guards"]
    assert {"topic-guard", "word-filter", "length-check", "raiser"} <= set(found["processor"])


async def test_the_panels_show_what_the_runs_did(prometheus: Prometheus) -> None:
    # Beyond "some data": the failure, the monitor decision, the limit hit are the runs' own.
    let_through = await prometheus.labels(as_sent(_expr("Failures let through (fail-open)")))
    assert {(s["agent"], s["entry"]) for s in let_through} == {("rollout", "raiser")}
    monitor = await prometheus.labels(as_sent(_expr("Monitor decisions (mode: monitor)")))
    assert ("rollout", "topic-guard", "abort") in {(s["agent"], s["entry"], s["would"]) for s in monitor}
    admissions = await prometheus.labels(as_sent(_expr("Cost control admissions")))
    assert {"admitted", "refused"} <= {s["outcome"] for s in admissions if s["agent"] == "budgeted"}


async def test_the_alert_rules_are_loaded_and_healthy(prometheus: Prometheus) -> None:
    response = await prometheus.client.get("/api/v1/rules")
    groups = response.json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == 12
    assert {rule["health"] for rule in rules} == {"ok"}, [r for r in rules if r["health"] != "ok"]


def _expr(title: str) -> str:
    return next(p["targets"][0]["expr"] for p in panels() if p["title"] == title)
