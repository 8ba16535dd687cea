"""`token-cost-control` in an agent's input lane, through a `procmesh-orchestrator` process and its
HTTP API (SEED-GAPS N1, N2): an organization's budget, keyed by the request context's
``organizationId`` as the reference keys it, is shared by the callers of that organization; a
call that replaces the input lane keeps the agent's cost control; its ``onViolation: log`` route
writes the violation to the orchestrator's log."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.cost.support import ADA, BOB, KEYS, PER_CALL, PRICES
from tests.e2e.service.conftest import OrchestratorProcess

OPERATOR = {"Authorization": "Bearer key-op"}
ANSWER = {"text": "ok", "usage": {"inputTokens": 10, "outputTokens": 5}}


def _config(tmp_path: Path) -> dict[str, Any]:
    limit = {"max_cost": 2 * PER_CALL, "scope": "organization", "reserve_output_tokens": 5}
    return {
        "storage": {"backend": "sqlite", "path": str(tmp_path / "memory.db")},
        "models": {"main": {"provider": "scripted", "responses": [ANSWER] * 20}},
        "prices": {"main": PRICES},
        "agents": {
            "spender": {
                "model": "main",
                "errorProcessorDefaults": False,
                "inputProcessors": [
                    {"processor": "cost-guard", "options": limit, "onViolation": "log"},
                ],
            }
        },
    }


async def _generate(base_url: str, headers: dict[str, str], org: str, **body: Any) -> dict[str, Any]:
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        response = await http.post(
            f"{base_url}/api/agents/spender/generate",
            json={"messages": "hi", "requestContext": {"organizationId": org}, **body},
        )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def test_an_organization_s_callers_share_its_budget(
    tmp_path: Path, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    keys = f"{KEYS},key-op=@operator"  # only an operator may replace an agent's lane for a call
    env = {"PROCMESH_API_KEYS": keys, "PROCMESH_TRUSTED_CONTEXT": '{"*": ["organizationId"]}'}
    proc = start_orchestrator(_config(tmp_path), env=env)
    url = proc.http_url
    ada = asyncio.run(_generate(url, ADA, "acme"))
    # an operator's call that replaces the input lane still counts, against the same budget
    operator = asyncio.run(_generate(url, OPERATOR, "acme", inputProcessors=[]))
    refused = asyncio.run(_generate(url, ADA, "acme"))
    other = asyncio.run(_generate(url, BOB, "globex"))
    statuses = [b["status"] for b in (ada, operator, refused, other)]
    assert statuses == ["success", "success", "tripwire", "success"]
    tripwire = refused["tripwire"]
    assert tripwire["processorId"] == "token-cost-control"
    assert tripwire["metadata"]["scopeKey"] == "organization:acme"
    assert tripwire["reason"] == "Cost control: estimated cost limit exceeded (0.01/0.01)"
    log = proc.log()
    assert log.count("violation of token-cost-control (agent spender, run ") == 1
