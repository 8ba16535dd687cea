"""Judge calls count: a guard's model call through the orchestrator's model gateway is priced and
held against the calling run's cost control like the agent's own calls.

The judge sidecar (`tests/e2e/gateway/judge.py`) asks the gateway for a verdict in processInput;
the judge model is priced, the agent's model is free, and the limit fits one judge call. The first
run's judge call spends the budget, so its own model call is refused; the next run's judge call
is refused by the gateway itself (RESOURCE_EXHAUSTED), and the guard's failure policy ends the run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.gateway.support import KEYS, gateway_calls
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import AUTH

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

JUDGE_COST = 0.005
"""A judge call: 5 output tokens at 1000 per million."""


def _config(sidecar: str) -> dict[str, Any]:
    verdict = {"text": '{"allowed": true}', "usage": {"inputTokens": 10, "outputTokens": 5}}
    return {
        "sidecars": {"j": {"address": sidecar, "timeout": 10}},
        "models": {
            "main": {"provider": "scripted", "responses": [{"text": "fine"}] * 5},
            "judge-ok": {"provider": "scripted", "responses": [verdict] * 5},
        },
        "prices": {"main": {"input": 0, "output": 0}, "judge-ok": {"input": 0, "output": 1000}},
        "agents": {
            "guarded": {
                "model": "main",
                "errorProcessorDefaults": False,
                "inputProcessors": [{"processor": "j/judge", "options": {"model": "judge-ok"}}],
                "costControl": {"maxCost": JUDGE_COST, "scope": "agent", "reserveOutputTokens": 5},
            }
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    judge_sidecar: SidecarProcess,
    gateway_port: int,
    tmp_path_factory: pytest.TempPathFactory,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    await judge_sidecar.wait_ready()
    cfg = _config(judge_sidecar.address)
    cfg["storage"] = {"path": str(tmp_path_factory.mktemp("cost") / "memory.db")}
    return await asyncio.to_thread(
        start_orchestrator, cfg, "--grpc-port", str(gateway_port), env={"PROCMESH_API_KEYS": KEYS}
    )


async def _generate(orchestrator: OrchestratorProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http:
        response = await http.post("/api/agents/guarded/generate", json={"messages": "hello"})
    body: dict[str, Any] = response.json()
    return body


async def test_a_judge_call_spends_the_runs_budget(orchestrator: OrchestratorProcess) -> None:
    first = await _generate(orchestrator)
    assert first["status"] == "tripwire", first
    tripwire = first["tripwire"]
    assert tripwire["processorId"] == "token-cost-control"
    assert tripwire["metadata"]["usage"]["estimatedCost"] == pytest.approx(JUDGE_COST)
    assert tripwire["metadata"]["scopeKey"] == "agent:guarded"
    assert gateway_calls(orchestrator)[("judge-ok", "judge", "ok")] == 1

    second = await _generate(orchestrator)
    assert second["status"] == "failed"
    assert "Cost control: estimated cost limit exceeded (0.005/0.005)" in second["error"]
    assert gateway_calls(orchestrator)[("judge-ok", "judge", "cost_limit")] == 1
