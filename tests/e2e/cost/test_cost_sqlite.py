"""Cost control in one `procmesh-orchestrator` process on its SQLite store: the limit under
concurrent runs, warn mode, a window that expires, scopes, and what a bad costControl says."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import BIN
from tests.e2e.cost.support import ADA, BOB, KEYS, PER_CALL, admissions, config, generate_all, outcomes
from tests.e2e.service.conftest import OrchestratorProcess

pytestmark = pytest.mark.e2e


def _sqlite(tmp_path: Path) -> dict[str, Any]:
    return {"backend": "sqlite", "path": str(tmp_path / "memory.db")}


def test_twenty_concurrent_runs_let_exactly_the_ten_that_fit_through(
    tmp_path: Path, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    proc = start_orchestrator(config(_sqlite(tmp_path)), env={"PROCMESH_API_KEYS": KEYS})
    bodies = asyncio.run(generate_all([proc.http_url] * 20, ADA))
    count = outcomes(bodies)
    print(f"\ncost control, 20 concurrent runs on SQLite, a limit of 10 calls: {dict(count)}")
    assert count == {"let through": 10, "refused": 10}
    # another resource has its own budget
    assert outcomes(asyncio.run(generate_all([proc.http_url] * 3, BOB))) == {"let through": 3}
    assert admissions(proc.http_url) == {"admitted": 13, "refused": 10}


def test_warn_mode_records_a_violation_and_lets_every_call_through(
    tmp_path: Path, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    cfg = config(_sqlite(tmp_path), strategy="warn", maxCost=2 * PER_CALL, warnAtPercent=50)
    proc = start_orchestrator(cfg, env={"PROCMESH_API_KEYS": KEYS})
    bodies = [asyncio.run(generate_all([proc.http_url], ADA))[0] for _ in range(4)]
    assert [b["status"] for b in bodies] == ["success"] * 4
    violations = [[(v["processorId"], v["detail"]["threshold"]) for v in b["violations"]] for b in bodies]
    # run 2 starts at half the limit (soft), runs 3 and 4 at or past it (hard)
    assert violations == [
        [],
        [("token-cost-control", "soft")],
        [("token-cost-control", "hard")],
        [("token-cost-control", "hard")],
    ]
    hard = bodies[3]["violations"][0]
    assert hard["message"] == "Cost control: estimated cost limit exceeded (0.015/0.01)"
    assert hard["detail"]["usage"] == pytest.approx(3 * PER_CALL)
    assert hard["detail"]["limit"] == pytest.approx(2 * PER_CALL)
    assert hard["detail"]["scopeKey"] == "resource:user-ada"
    assert admissions(proc.http_url) == {"admitted": 2, "warned": 2}


def test_spending_older_than_the_window_no_longer_counts(
    tmp_path: Path, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    cfg = config(_sqlite(tmp_path), maxCost=PER_CALL, window="2s", scope="agent")
    proc = start_orchestrator(cfg, env={"PROCMESH_API_KEYS": KEYS})
    first = asyncio.run(generate_all([proc.http_url, proc.http_url], ADA))
    assert outcomes(first) == {"let through": 1, "refused": 1}
    # the agent scope counts every resource's calls
    (refused,) = asyncio.run(generate_all([proc.http_url], BOB))
    assert refused["tripwire"]["metadata"]["scopeKey"] == "agent:spender"
    time.sleep(2.2)  # the window passes the first call
    assert outcomes(asyncio.run(generate_all([proc.http_url], BOB))) == {"let through": 1}


def test_the_thread_scope_is_each_resources_own_thread(
    tmp_path: Path, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    # thread ids are scoped by resource: Bob's "t1" is not Ada's, and neither spends the other's budget
    proc = start_orchestrator(
        config(_sqlite(tmp_path), maxCost=PER_CALL, scope="thread"), env={"PROCMESH_API_KEYS": KEYS}
    )

    def on_t1(headers: dict[str, str]) -> dict[str, Any]:
        body = {"messages": "hi", "threadId": "t1"}
        response = httpx.post(f"{proc.http_url}/api/agents/spender/generate", json=body, headers=headers)
        assert response.status_code == 200, response.text
        out: dict[str, Any] = response.json()
        return out

    ada = [on_t1(ADA), on_t1(ADA)]
    assert outcomes(ada) == {"let through": 1, "refused": 1}
    assert ada[1]["tripwire"]["metadata"]["scopeKey"] == "thread:8:user-ada/t1"
    assert outcomes([on_t1(BOB)]) == {"let through": 1}


@pytest.mark.parametrize(
    ("cost", "prices", "message"),
    [
        ({"maxCost": 0}, None, "agents.spender.costControl.maxCost: Input should be greater than 0"),
        ({"window": "1w"}, None, "window must be <n>s, <n>m, <n>h or <n>d (e.g. 30d), got '1w'"),
        ({"window": "400d"}, None, "window '400d' is longer than 366 days"),
        (
            {"scope": "planet"},
            None,
            "Input should be 'run', 'resource', 'thread', 'user', 'organization', 'session', 'agent' or "
            "'global'",
        ),
        ({"warnAtPercent": 100}, None, "agents.spender.costControl.warnAtPercent"),
        ({}, {}, "agents.spender.costControl: model 'main' has no price (add prices.main"),
    ],
)
def test_a_bad_cost_control_stops_the_start_with_the_key_and_the_problem(
    tmp_path: Path, cost: dict[str, Any], prices: dict[str, Any] | None, message: str
) -> None:
    cfg = config(_sqlite(tmp_path), **cost)
    if prices is not None:
        cfg["prices"] = prices
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    done = subprocess.run(
        [str(BIN / "procmesh-orchestrator"), "--config", str(path), "--http-port", "0", "--grpc-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert message in done.stderr + done.stdout
    assert not (tmp_path / "memory.db").exists(), "nothing was written"
