"""An agent's requestContextSchema over the HTTP and gRPC APIs, with a real sidecar: a missing
required key or a key the agent does not declare is a 400 / INVALID_ARGUMENT naming it before any
run starts (the processor and the model see nothing); the per-key trust is checked first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio

from procmesh import Processor, ProcessorServer
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.support import grpc_generate_refused

pytestmark = [pytest.mark.asyncio(loop_scope="module")]


class Tenant(Processor):
    """Reports the tenant it saw, as a violation the response carries."""

    id = "tenant"

    async def process_input(self, messages: list[Any], request_context: Any, report_violation: Any) -> None:
        report_violation(f"tenant {request_context.get('tenant')}", None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    async with ProcessorServer([Tenant()], ["127.0.0.1:0"]) as sidecar:
        config = {
            "sidecars": {"s": {"address": sidecar.addresses[0]}},
            "storage": {"backend": "sqlite", "path": str(tmp_path_factory.mktemp("ctx") / "memory.db")},
            "models": {
                "answer": {"provider": "scripted", "responses": [{"text": "ok"}] * 20},
                "demo": {"provider": "demo"},
            },
            "tools": {
                "weather": {"description": "Weather", "inputSchema": {"type": "object"}, "result": "sunny"}
            },
            "agents": {
                "t": {
                    "model": "demo",
                    "errorProcessorDefaults": False,
                    "tools": ["weather"],
                    "requestContextSchema": {
                        "properties": {"tier": {"enum": ["gold", "free"]}},
                        "required": ["tier"],
                    },
                },
                "a": {
                    "model": "answer",
                    "errorProcessorDefaults": False,
                    "inputProcessors": ["s/tenant"],
                    "requestContextSchema": {
                        "properties": {"tenant": {"type": "string"}, "tier": {"enum": ["gold", "free"]}},
                        "required": ["tenant"],
                    },
                },
            },
        }
        settings = OrchestratorSettings(
            http_port=0,
            grpc_port=0,
            api_keys=["k-acme=acme"],
            trusted_context={"acme": ["tenant", "tier", "region"]},
        )
        async with Service(settings, parse_config(config)) as svc:
            yield svc


def _model_calls(service: Service) -> int:
    model = service.app.models["answer"]
    assert isinstance(model, ScriptedModel)
    return len(model.requests)


async def _post(service: Service, context: dict[str, Any], route: str = "generate") -> httpx.Response:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{service.http_port}", headers={"Authorization": "Bearer k-acme"}
    ) as http:
        return await http.post(f"/api/agents/a/{route}", json={"messages": "hi", "requestContext": context})


async def test_an_accepted_context_reaches_the_processor(service: Service) -> None:
    response = await _post(service, {"tenant": "acme", "tier": "gold"})
    assert response.status_code == 200, response.text
    assert [v["message"] for v in response.json()["violations"]] == ["tenant acme"]


@pytest.mark.parametrize("route", ["generate", "stream"])
@pytest.mark.parametrize(
    ("context", "error"),
    [
        ({"tier": "gold"}, "requestContext: agent 'a' requires 'tenant' (requestContextSchema)"),
        ({"tenant": "acme", "region": "eu"}, "requestContext: agent 'a' does not declare 'region'"),
        ({"tenant": "acme", "tier": "platinum"}, "requestContext.tier: 'platinum' is not one of"),
    ],
)
async def test_a_refused_context_is_a_400_before_any_run(
    service: Service, route: str, context: dict[str, Any], error: str
) -> None:
    before = _model_calls(service)
    response = await _post(service, context, route)
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(error)
    assert _model_calls(service) == before


async def test_trust_is_checked_before_the_schema(service: Service) -> None:
    response = await _post(service, {"tenant": "acme", "debug": True})
    assert response.status_code == 400
    assert "this API key may not send 'debug' (PROCMESH_TRUSTED_CONTEXT" in response.json()["error"]


async def test_over_grpc_it_is_invalid_argument_naming_the_key(service: Service) -> None:
    error = await grpc_generate_refused(service, {"tier": "gold"}, "k-acme")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "requires 'tenant'" in (error.details() or "")


async def test_a_resume_is_held_to_the_schema_and_a_refused_one_leaves_the_run_suspended(
    service: Service,
) -> None:
    """An approval's (or decline's, or resume-stream's) requestContext goes over the suspended
    call's into the resumed run: the agent's requestContextSchema checks what it runs with, as it
    checks a generate's, and a refusal takes no decision (the run can still be approved)."""
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{service.http_port}", headers={"Authorization": "Bearer k-acme"}
    ) as http:
        body = {"messages": "weather?", "requireToolApproval": True, "requestContext": {"tier": "gold"}}
        suspended = (await http.post("/api/agents/t/generate", json=body)).json()
        assert suspended["status"] == "suspended", suspended
        decision = {"runId": suspended["runId"], "toolCallId": suspended["suspendPayload"]["toolCallId"]}
        for route, extra in [
            ("approve-tool-call-generate", {}),
            ("decline-tool-call", {}),
            ("resume-stream", {"resumeData": {"approved": True}}),
        ]:
            bad = {**decision, **extra, "requestContext": {"tier": "platinum"}}
            refused = await http.post(f"/api/agents/t/{route}", json=bad)
            assert refused.status_code == 400, (route, refused.text)
            assert refused.json()["error"].startswith("requestContext.tier: 'platinum' is not one of")
        approved = await http.post(
            "/api/agents/t/approve-tool-call-generate", json={**decision, "requestContext": {"tier": "free"}}
        )
        assert approved.json()["status"] == "success", approved.text


async def test_a_resume_without_a_context_goes_on_with_the_suspended_calls(service: Service) -> None:
    """The schema checks the context the resumed run goes on with: the suspended call's, the
    resuming call's keys over it. A resume that gives none holds the required key it saved."""
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{service.http_port}", headers={"Authorization": "Bearer k-acme"}
    ) as http:
        body = {"messages": "weather?", "requireToolApproval": True, "requestContext": {"tier": "gold"}}
        for route in ["approve-tool-call-generate", "decline-tool-call-generate"]:
            suspended = (await http.post("/api/agents/t/generate", json=body)).json()
            assert suspended["status"] == "suspended", suspended
            decision = {"runId": suspended["runId"], "toolCallId": suspended["suspendPayload"]["toolCallId"]}
            resumed = await http.post(f"/api/agents/t/{route}", json=decision)
            assert resumed.status_code == 200, (route, resumed.text)
            assert resumed.json()["status"] == "success", resumed.text
