"""PROCMESH_UNTRUSTED_CONTEXT=drop over the HTTP and gRPC APIs, with a real sidecar: keys a caller
is not trusted for are dropped, never silently (a response header / initial metadata naming them,
one WARNING, the counter); reserved keys and a missing required key are still refused."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from google.protobuf import struct_pb2

from procmesh import Processor, ProcessorServer, convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as apb_grpc
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.support import grpc_generate_refused

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

HEADER = "X-Procmesh-Dropped-Context"


class Keys(Processor):
    """Reports the request-context keys it saw, as a violation the response carries."""

    id = "keys"

    async def process_input(self, messages: list[Any], request_context: Any, report_violation: Any) -> None:
        report_violation("keys " + ",".join(sorted(request_context)), None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service() -> AsyncIterator[Service]:
    async with ProcessorServer([Keys()], ["127.0.0.1:0"]) as sidecar:
        config = {
            "sidecars": {"s": {"address": sidecar.addresses[0]}},
            "models": {"answer": {"provider": "scripted", "responses": [{"text": "ok"}] * 40}},
            "agents": {
                "a": {
                    "model": "answer",
                    "errorProcessorDefaults": False,
                    "inputProcessors": ["s/keys"],
                    "requestContextSchema": {
                        "properties": {"tenant": {"type": "string"}, "tier": {"type": "string"}},
                        "required": ["tenant"],
                        "additionalProperties": True,
                    },
                },
                "closed": {
                    "model": "answer",
                    "errorProcessorDefaults": False,
                    "inputProcessors": ["s/keys"],
                    "requestContextSchema": {"properties": {"tenant": {"type": "string"}}},
                },
            },
        }
        settings = OrchestratorSettings(
            http_port=0,
            grpc_port=0,
            api_keys=["k-acme=acme", "k-other=other"],
            trusted_context={"acme": ["tenant", "tier", "region"], "other": ["tier"]},
            untrusted_context="drop",
        )
        async with Service(settings, parse_config(config)) as svc:
            yield svc


def _dropped(service: Service, agent: str = "a") -> float:
    value = service.metrics.registry.get_sample_value(
        "procmesh_request_context_dropped_total", {"agent": agent}
    )
    return value or 0.0


def _keys_seen(events: list[dict[str, Any]] | dict[str, Any]) -> list[str]:
    violations = events["violations"] if isinstance(events, dict) else events
    return [v["message"] for v in violations]


async def _post(
    service: Service, context: dict[str, Any], route: str = "generate", key: str = "k-acme", agent: str = "a"
) -> httpx.Response:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{service.http_port}", headers={"Authorization": f"Bearer {key}"}
    ) as http:
        body = {"messages": "hi", "requestContext": context}
        return await http.post(f"/api/agents/{agent}/{route}", json=body)


async def test_generate_runs_without_the_untrusted_keys_and_names_them(
    service: Service, caplog: pytest.LogCaptureFixture
) -> None:
    before = _dropped(service)
    with caplog.at_level(logging.WARNING, "procmesh_orchestrator.service._trust"):
        response = await _post(service, {"tenant": "acme", "debug": True, "x y,z": 1})
    assert response.status_code == 200, response.text
    # percent-encoded: a key with a comma or a space cannot split or break the list
    assert response.headers[HEADER] == "debug, x%20y%2Cz"
    assert _keys_seen(response.json()) == ["keys tenant"]
    assert _dropped(service) == before + 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "http agent=a: requestContext 'debug', 'x y,z' dropped" in warnings[0]


async def test_a_stream_names_them_in_its_headers(service: Service) -> None:
    before = _dropped(service)
    response = await _post(service, {"tenant": "acme", "debug": True}, "stream")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers[HEADER] == "debug"
    assert '"keys tenant"' in response.text
    assert _dropped(service) == before + 1


async def test_a_trusted_context_has_no_header_and_counts_nothing(service: Service) -> None:
    before = _dropped(service)
    response = await _post(service, {"tenant": "acme", "tier": "gold"})
    assert response.status_code == 200, response.text
    assert HEADER not in response.headers
    assert _keys_seen(response.json()) == ["keys tenant,tier"]
    assert _dropped(service) == before


async def test_keys_the_agent_does_not_declare_are_dropped_too(service: Service) -> None:
    # region is trusted but "closed" does not declare it; debug is declared nowhere and untrusted
    before = _dropped(service, "closed")
    response = await _post(service, {"tenant": "acme", "region": "eu", "debug": 1}, agent="closed")
    assert response.status_code == 200, response.text
    assert response.headers[HEADER] == "debug, region"
    assert _keys_seen(response.json()) == ["keys tenant"]
    assert _dropped(service, "closed") == before + 1
    # the open agent takes region: nothing dropped
    response = await _post(service, {"tenant": "acme", "region": "eu"})
    assert HEADER not in response.headers
    assert _keys_seen(response.json()) == ["keys region,tenant"]


@pytest.mark.parametrize("reserved", ["resourceId", "threadId", "responseCache"])
async def test_reserved_keys_are_refused_even_in_drop_mode(service: Service, reserved: str) -> None:
    before = _dropped(service)
    response = await _post(service, {"tenant": "acme", reserved: "someone-else"})
    assert response.status_code == 400
    assert f"requestContext: '{reserved}' reserved" in response.json()["error"]
    assert _dropped(service) == before


async def test_dropping_a_required_key_is_a_400(service: Service) -> None:
    # k-other may send tier only: its tenant is dropped, and the agent requires one
    response = await _post(service, {"tenant": "other", "tier": "gold"}, key="k-other")
    assert response.status_code == 400
    assert response.json()["error"] == (
        "requestContext: agent 'a' requires 'tenant' (requestContextSchema), missing from the "
        "request context (dropped: 'tenant', PROCMESH_UNTRUSTED_CONTEXT=drop)"
    )


@pytest.mark.parametrize("rpc", ["Generate", "Stream"])
async def test_over_grpc_the_initial_metadata_names_them(service: Service, rpc: str) -> None:
    before = _dropped(service)
    context = struct_pb2.Struct()
    context.update({"tenant": "acme", "debug": True})
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = apb_grpc.AgentServiceStub(channel)
        auth = (("authorization", "Bearer k-acme"),)
        if rpc == "Generate":
            unary = stub.Generate(
                apb.GenerateRequest(agent_id="a", text="hi", request_context=context), metadata=auth
            )
            metadata = await unary.initial_metadata()
            violations = [v.message for v in (await unary).violations]
        else:
            stream = stub.Stream(
                apb.StreamRequest(agent_id="a", text="hi", request_context=context), metadata=auth
            )
            metadata = await stream.initial_metadata()
            chunks = [convert.chunk_from_proto(r.chunk) async for r in stream if r.HasField("chunk")]
            violations = [c["data"]["message"] for c in chunks if c["type"] == "data-procmesh-violation"]
    assert dict(metadata)["x-procmesh-dropped-context"] == "debug"
    assert violations == ["keys tenant"]
    assert _dropped(service) == before + 1


async def test_over_grpc_a_reserved_key_is_still_invalid_argument(service: Service) -> None:
    error = await grpc_generate_refused(service, {"tenant": "acme", "resourceId": "someone-else"}, "k-acme")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'resourceId' reserved" in (error.details() or "")
