"""Processor options from the request context over the HTTP and gRPC APIs: each tenant's value
reaches the processor, and a value its published schema refuses is a 400 / INVALID_ARGUMENT
naming the processor, the option and the key, before any run starts (no model call)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio

from procmesh import ProcessorServer
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.support import Budget, grpc_generate_refused

pytestmark = [pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service() -> AsyncIterator[Service]:
    async with ProcessorServer([Budget()], ["127.0.0.1:0"]) as sidecar:
        config = {
            "sidecars": {"s": {"address": sidecar.addresses[0]}},
            "models": {"answer": {"provider": "scripted", "responses": [{"text": "ok"}] * 20}},
            "agents": {
                "a": {
                    "model": "answer",
                    "errorProcessorDefaults": False,
                    "inputProcessors": [
                        {
                            "processor": "s/budget",
                            "options": {"limit": {"fromContext": "limit", "default": 100}},
                        }
                    ],
                }
            },
        }
        settings = OrchestratorSettings(
            http_port=0, grpc_port=0, api_keys=["k-acme=acme"], trusted_context={"acme": ["limit"]}
        )
        async with Service(settings, parse_config(config)) as svc:
            yield svc


def _model_calls(service: Service) -> int:
    model = service.app.models["answer"]
    assert isinstance(model, ScriptedModel)
    return len(model.requests)


async def _generate(service: Service, context: dict[str, Any] | None) -> httpx.Response:
    body: dict[str, Any] = {"messages": "hi"}
    if context is not None:
        body["requestContext"] = context
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{service.http_port}", headers={"Authorization": "Bearer k-acme"}
    ) as http:
        return await http.post("/api/agents/a/generate", json=body)


@pytest.mark.parametrize(("context", "limit"), [(None, 100), ({"limit": 7}, 7)])
async def test_the_tenants_value_reaches_the_processor(
    service: Service, context: dict[str, Any] | None, limit: int
) -> None:
    response = await _generate(service, context)
    assert response.status_code == 200, response.text
    assert [v["message"] for v in response.json()["violations"]] == [f"limit {limit}"]


@pytest.mark.parametrize("value", ["lots", 0, -3])
async def test_a_value_the_schema_refuses_is_a_400_before_any_run(service: Service, value: Any) -> None:
    before = _model_calls(service)
    response = await _generate(service, {"limit": value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error.startswith("processor 'budget': option limit (request-context key 'limit'): ")
    assert json.dumps(value) in error or repr(value) in error
    assert _model_calls(service) == before


async def test_over_grpc_it_is_invalid_argument(service: Service) -> None:
    error = await grpc_generate_refused(service, {"limit": "lots"}, "k-acme")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "option limit (request-context key 'limit')" in (error.details() or "")
