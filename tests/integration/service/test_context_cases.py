"""A request-context value that picks a case (a lane by context, an option's ``cases``) but is no
string: the run takes the default, as the reference's runner does, and the call's warnings name
the key (``requestContext.KEY``), counted under ``setting="requestContext"`` (never the key)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh import ProcessorServer
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.support import Budget, settings_ignored

pytestmark = [pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with ProcessorServer([Budget()], ["127.0.0.1:0"]) as sidecar:
        budget = {
            "processor": "s/budget",
            "options": {"limit": {"fromContext": "tier", "cases": {"gold": 500}, "default": 100}},
        }
        config = {
            "sidecars": {"s": {"address": sidecar.addresses[0]}},
            "models": {"answer": {"provider": "scripted", "responses": [{"text": "ok"}] * 20}},
            "agents": {
                "by-option": {
                    "model": "answer",
                    "errorProcessorDefaults": False,
                    "inputProcessors": [budget],
                },
                "by-lane": {
                    "model": "answer",
                    "errorProcessorDefaults": False,
                    "inputProcessorsByContext": {
                        "key": "plan",
                        "cases": {"pro": [{"processor": "s/budget", "options": {"limit": 7}}]},
                        "default": [],
                    },
                },
            },
        }
        settings = OrchestratorSettings(
            http_port=0, grpc_port=0, api_keys=["k-acme=acme"], trusted_context={"acme": ["tier", "plan"]}
        )
        async with Service(settings, parse_config(config)) as svc:
            url = f"http://127.0.0.1:{svc.http_port}"
            async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer k-acme"}) as client:
                yield client


async def _generate(http: httpx.AsyncClient, agent: str, context: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(
        f"/api/agents/{agent}/generate", json={"messages": "hi", "requestContext": context}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _limits(body: dict[str, Any]) -> list[int]:
    return [v["detail"]["limit"] for v in body.get("violations", [])]


def _warned(body: dict[str, Any]) -> list[str]:
    return [w["setting"] for w in body["warnings"]]


async def test_a_value_that_is_no_string_takes_the_default_and_is_named(http: httpx.AsyncClient) -> None:
    before = await settings_ignored(http, "requestContext")
    gold = await _generate(http, "by-option", {"tier": "gold"})
    assert (_limits(gold), _warned(gold)) == ([500], [])
    number = await _generate(http, "by-option", {"tier": 2})
    assert _limits(number) == [100]  # the default, as the reference's runner takes it
    assert _warned(number) == ["requestContext.tier"]
    assert "not a string" in number["warnings"][0]["details"]
    absent = await _generate(http, "by-option", {})
    assert (_limits(absent), _warned(absent)) == ([100], [])  # a missing key is the default's case
    assert await settings_ignored(http, "requestContext") == before + 1
    lane = await _generate(http, "by-lane", {"plan": True})
    assert (_limits(lane), _warned(lane)) == ([], ["requestContext.plan"])  # the default lane: empty
    pro = await _generate(http, "by-lane", {"plan": "pro"})
    assert (_limits(pro), _warned(pro)) == ([7], [])
    assert await settings_ignored(http, "requestContext") == before + 2
