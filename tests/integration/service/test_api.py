"""The orchestrator's HTTP and gRPC APIs, served in-process on port 0 against a real sidecar process.

One `Service` (HTTP + gRPC) per module over one `procmesh-sidecar examples` process;
every test calls it over real sockets with httpx or a grpc.aio channel.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._limits import InputLimits
from procmesh_orchestrator.service._trust import ContextTrust
from procmesh_orchestrator.service.api.calls import parse_body
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.integration.service.support import (
    API_KEY,
    API_KEYS,
    AUTH,
    GRPC_AUTH,
    SECRET,
    agent_stub,
    demo_answer,
    http_client,
    service_config,
    stream_chunks,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

MAX_BYTES = 16 * 1024
JSON = {"content-type": "application/json"}
LIMITS = InputLimits()
OPERATOR = Caller("key-1", None, frozenset({"operator"}))
MASKED = demo_answer("hello").replace("Darn", "****")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(start_sidecar: Callable[..., SidecarProcess]) -> AsyncIterator[Service]:
    sidecar = start_sidecar("examples", name="api-guards")
    await sidecar.wait_ready()
    settings = OrchestratorSettings(
        http_port=0,
        grpc_port=0,
        api_keys=[SecretStr(API_KEYS), SecretStr("second-key=@operator")],
        max_request_bytes=MAX_BYTES,
        health_poll_seconds=0.2,
    )
    async with Service(settings, parse_config(service_config({"guards": sidecar.address}))) as svc:
        yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(service, AUTH, timeout=10) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def stub(service: Service) -> AsyncIterator[agrpc.AgentServiceAsyncStub]:
    async with agent_stub(service) as stub:
        yield stub


# -- HTTP: agents ------------------------------------------------------------------------


async def test_agents_are_listed_with_their_instructions(http: httpx.AsyncClient) -> None:
    response = await http.get("/api/agents")
    assert response.status_code == 200
    agents = response.json()
    assert sorted(agents) == ["assistant", "concise", "slow"]
    assert agents["assistant"]["instructions"] == "You are helpful."
    one = await http.get("/api/agents/concise")
    assert one.json() == agents["concise"]  # all details: tests/e2e/service/test_clientjs_catalog.py
    assert one.json()["instructions"] == "Be brief."


async def test_generate_returns_the_reference_result_shape(http: httpx.AsyncClient) -> None:
    response = await http.post("/api/agents/assistant/generate", json={"messages": "hello"})
    assert response.status_code == 200
    body = response.json()
    assert body["text"] == MASKED  # the word-filter sidecar masked "Darn"
    assert body["finishReason"] == "stop"
    assert body["tripwire"] is None
    assert body["runId"]
    assert "error" not in body
    assert body["usage"]["totalTokens"] == body["usage"]["inputTokens"] + body["usage"]["outputTokens"]
    assert [s["text"] for s in body["steps"]] == [MASKED]
    (message,) = body["response"]["messages"]
    assert message["role"] == "assistant"
    assert message["content"]["parts"] == [{"type": "text", "text": MASKED}]


async def test_generate_takes_message_lists_and_call_options(http: httpx.AsyncClient) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Answer in English."},
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        ],
        "maxSteps": 1,
        "maxProcessorRetries": 0,
    }
    response = await http.post("/api/agents/assistant/generate", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["text"] == MASKED


async def test_a_guard_ends_generate_with_a_tripwire(http: httpx.AsyncClient) -> None:
    response = await http.post("/api/agents/assistant/generate", json={"messages": "a jailbreak please"})
    assert response.status_code == 200
    body = response.json()
    assert body["text"] == ""
    assert body["finishReason"] == "other"
    assert body["tripwire"]["processorId"] == "topic-guard"
    assert body["tripwire"]["reason"] == "Blocked: the request mentions 'jailbreak'"
    assert body["tripwire"]["metadata"] == {"category": "topic", "word": "jailbreak"}


async def test_stream_sends_each_chunk_as_an_event_then_done(http: httpx.AsyncClient) -> None:
    events = await stream_chunks(http, "assistant", {"messages": "hello"})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [c["type"] for c in chunks[:2]] == ["start", "step-start"]
    assert chunks[-1]["type"] == "finish"
    run_id = chunks[0]["payload"]["runId"]
    assert all(c["runId"] == run_id and c["from"] == "AGENT" for c in chunks)
    deltas = [c["payload"]["text"] for c in chunks if c["type"] == "text-delta"]
    assert len(deltas) > 5
    assert "".join(deltas) == MASKED
    finish = chunks[-1]["payload"]
    assert finish["finishReason"] == "stop"
    assert finish["stepResult"] == {"reason": "stop"}  # where @mastra/client-js reads it


async def test_stream_ends_with_a_tripwire_chunk_when_a_guard_aborts(http: httpx.AsyncClient) -> None:
    events = await stream_chunks(http, "assistant", {"messages": [{"role": "user", "content": "jailbreak"}]})
    assert events[-1] == "[DONE]"
    tripwire = events[-2]
    assert tripwire["type"] == "tripwire"
    assert tripwire["payload"]["processorId"] == "topic-guard"
    assert not [c for c in events[:-1] if c["type"] == "text-delta"]


async def test_unknown_agents_get_404_naming_the_configured_ones(http: httpx.AsyncClient) -> None:
    for method, path in [
        ("POST", "/api/agents/nobody/generate"),
        ("POST", "/api/agents/nobody/stream"),
        ("GET", "/api/agents/nobody"),
    ]:
        response = await http.request(method, path, json={"messages": "hi"})
        assert response.status_code == 404, path
        assert response.json() == {
            "error": "unknown agent 'nobody' (configured: ['assistant', 'concise', 'slow'])"
        }


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (b'{"messages": "hi"', "malformed JSON body"),
        (b"", "empty body"),
        (b"[1, 2]", "must be a JSON object"),
        (b"{}", "messages: Field required"),
        (b'{"messages": []}', "messages: Value error, must hold at least one message"),
        (b'{"messages": [{"role": "tool", "content": "x"}]}', "messages.0.content: a tool message holds"),
        (b'{"messages": [{"role": "user", "content": [{"type": "widget"}]}]}', "unsupported part 'widget'"),
        (b'{"messages": "hi", "maxSteps": 0}', "maxSteps: Input should be greater than or equal to 1"),
        (b'{"messages": "hi", "maxProcessorRetries": "many"}', "maxProcessorRetries: Input should be"),
    ],
)
async def test_malformed_requests_get_400_saying_what_is_wrong(
    http: httpx.AsyncClient, content: bytes, error: str
) -> None:
    response = await http.post(
        "/api/agents/assistant/generate", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert error in response.json()["error"]


async def test_bodies_over_the_limit_get_413(http: httpx.AsyncClient) -> None:
    big = b'{"messages": "' + b"x" * MAX_BYTES + b'"}'
    response = await http.post("/api/agents/assistant/generate", content=big, headers=JSON)
    assert response.status_code == 413
    assert response.json()["error"] == (
        f"request body of {len(big)} bytes exceeds the limit of {MAX_BYTES} bytes"
    )

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted while reading
        yield b'{"messages": "'
        for _ in range(MAX_BYTES // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    response = await http.post("/api/agents/assistant/stream", content=chunked(), headers=JSON)
    assert response.status_code == 413
    assert response.json()["error"] == f"request body exceeds the limit of {MAX_BYTES} bytes"


async def test_wrong_method_and_path_get_json_errors(http: httpx.AsyncClient) -> None:
    response = await http.get("/api/agents/assistant/generate")
    assert response.status_code == 405
    assert response.json() == {"error": "Method Not Allowed"}
    response = await http.get("/api/nothing")
    assert response.status_code == 404
    assert response.json() == {"error": "Not Found"}


# -- HTTP: keys, context, probes, metrics --------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ({}, "missing API key: send the header 'Authorization: Bearer <key>'"),
        ({"Authorization": "Bearer wrong"}, "invalid API key"),
        ({"Authorization": f"Basic {API_KEY}"}, "malformed Authorization header: expected 'Bearer <key>'"),
        ({"Authorization": "Bearer"}, "malformed Authorization header: expected 'Bearer <key>'"),
    ],
)
async def test_api_routes_need_a_valid_key(service: Service, headers: dict[str, str], error: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as client:
        for method, path in [
            ("GET", "/api/agents"),
            ("POST", "/api/agents/assistant/generate"),
            ("POST", "/api/agents/assistant/stream"),
            ("POST", "/api/agents/nobody/generate"),  # no hint that the agent does not exist
        ]:
            response = await client.request(method, path, json={"messages": "hi"}, headers=headers)
            assert response.status_code == 401, path
            assert response.json() == {"error": error}
            assert response.headers["www-authenticate"].startswith("Bearer")


async def test_any_configured_key_works_and_probes_and_metrics_need_none(service: Service) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}") as client:
        response = await client.get("/api/agents", headers={"Authorization": "bearer second-key"})
        assert response.status_code == 200
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        ready = await client.get("/readyz")
        assert ready.status_code == 200
        version = service.app.version  # the serving config's, 12 hex digits
        assert re.fullmatch("[0-9a-f]{12}", version)
        assert ready.json() == {
            "status": "ready",
            "sidecars": {"guards": "SERVING"},
            "configVersion": version,
        }
        assert (await client.get("/metrics")).status_code == 200


async def test_request_context_the_caller_is_not_trusted_for_is_refused_naming_the_keys(
    http: httpx.AsyncClient, service: Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = service.app.agents["assistant"]
    seen: list[CallOptions] = []
    original = agent.generate

    async def spy(input: Any, options: CallOptions | None = None) -> Any:
        assert options is not None
        seen.append(options)
        return await original(input, options)

    monkeypatch.setattr(agent, "generate", spy)
    forged = {"userId": "admin", "tier": "enterprise"}
    for key in ("requestContext", "runtimeContext"):
        response = await http.post("/api/agents/assistant/generate", json={"messages": "hello", key: forged})
        assert response.status_code == 400, response.text
        assert response.json()["error"] == (
            f"{key}: this API key may not send 'tier', 'userId' (PROCMESH_TRUSTED_CONTEXT says which keys "
            "each caller may send)"
        )
    empty = await http.post("/api/agents/assistant/generate", json={"messages": "hi", "requestContext": {}})
    assert empty.status_code == 200
    assert [options.request_context for options in seen] == [{}]
    # Trusted for them (PROCMESH_TRUSTED_CONTEXT), the caller's keys are passed on.
    trust = ContextTrust.of({"@operator": ["userId", "tier"]}, [], legacy=False)
    call = parse_body(
        {"messages": "hi", "requestContext": forged}, caller=OPERATOR, trust=trust, limits=LIMITS
    )
    assert call.options.request_context == forged


async def test_metrics_expose_runs_and_process_series_without_user_content(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await http.post("/api/agents/assistant/generate", json={"messages": f"my secret is {SECRET}"})
    await stream_chunks(http, "assistant", {"messages": f"jailbreak {SECRET}"})
    async with httpx.AsyncClient(base_url=http.base_url) as anonymous:
        await anonymous.get("/api/agents")  # a 401, counted
    response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for series in [
        'procmesh_runs_total{agent="assistant",finish_reason="stop"}',
        'procmesh_runs_total{agent="assistant",finish_reason="other"}',
        'procmesh_tripwires_total{agent="assistant",entry="topic-guard",hook="process_input",'
        'processor="topic-guard",sidecar="guards"}',
        'procmesh_processor_calls_total{agent="assistant",entry="topic-guard",hook="process_input",'
        'outcome="ok",processor="topic-guard",sidecar="guards"}',
        'procmesh_run_duration_seconds_bucket{agent="assistant",le="+Inf"}',
        'procmesh_api_requests_total{api="http",code="401"}',
        'procmesh_sidecar_serving{sidecar="guards"} 1.0',
        "procmesh_inflight_runs 0.0",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
    ]:
        assert series in text, series
    assert SECRET not in text
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and SECRET in r.getMessage()]
    assert [r for r in caplog.records if r.getMessage().startswith("generate agent=assistant run=")]

    openmetrics = await http.get("/metrics", headers={"Accept": "application/openmetrics-text"})
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")
    assert openmetrics.text.count("# EOF") == 1


# -- gRPC -------------------------------------------------------------------------------------


async def test_grpc_generate_returns_the_result(stub: agrpc.AgentServiceAsyncStub) -> None:
    response = await stub.Generate(
        apb.GenerateRequest(agent_id="assistant", text="hello"), metadata=GRPC_AUTH
    )
    assert response.text == MASKED
    assert response.finish_reason == "stop"
    assert response.run_id
    assert not response.HasField("tripwire")
    assert response.usage.total_tokens > 0
    assert [convert.message_from_proto(m)["role"] for m in response.response_messages] == ["assistant"]
    assert response.steps[0].text == MASKED


async def test_grpc_generate_takes_messages_and_reports_tripwires(stub: agrpc.AgentServiceAsyncStub) -> None:
    message = tpb.Message(role="user")
    message.content.parts.add().text.text = "tell me about jailbreak"
    response = await stub.Generate(
        apb.GenerateRequest(agent_id="assistant", messages=[message], max_steps=2), metadata=GRPC_AUTH
    )
    assert response.finish_reason == "other"
    assert response.tripwire.processor_id == "topic-guard"
    assert response.tripwire.reason == "Blocked: the request mentions 'jailbreak'"


async def test_grpc_stream_sends_proto_chunks(stub: agrpc.AgentServiceAsyncStub) -> None:
    responses = [
        r
        async for r in stub.Stream(apb.StreamRequest(agent_id="assistant", text="hello"), metadata=GRPC_AUTH)
    ]
    *streamed, last = responses
    assert not last.HasField("chunk")  # the last message carries the run's status only
    assert last.status == "success"
    chunks = [convert.chunk_from_proto(r.chunk) for r in streamed]
    assert chunks[0]["type"] == "start"
    run_id = chunks[0]["payload"]["runId"]
    assert {r.run_id for r in responses} == {run_id}
    assert "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta") == MASKED
    assert chunks[-1] == {
        "type": "finish",
        "payload": {"finishReason": "stop", "usage": chunks[-1]["payload"]["usage"]},
    }
    guarded = [
        convert.chunk_from_proto(r.chunk)
        async for r in stub.Stream(
            apb.StreamRequest(agent_id="assistant", text="jailbreak"), metadata=GRPC_AUTH
        )
        if r.HasField("chunk")
    ]
    assert guarded[-1]["type"] == "tripwire"
    assert guarded[-1]["payload"]["processorId"] == "topic-guard"


@pytest.mark.parametrize(
    ("metadata", "details"),
    [
        ((), "missing API key: send the header 'Authorization: Bearer <key>'"),
        ((("authorization", "Bearer nope"),), "invalid API key"),
    ],
)
async def test_grpc_needs_a_valid_key(
    stub: agrpc.AgentServiceAsyncStub, metadata: tuple[tuple[str, str], ...], details: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Generate(apb.GenerateRequest(agent_id="assistant", text="hi"), metadata=metadata)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert info.value.details() == details
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.Stream(apb.StreamRequest(agent_id="assistant", text="hi"), metadata=metadata):
            pass
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize(
    ("request_", "code", "details"),
    [
        (
            apb.GenerateRequest(agent_id="nobody", text="hi"),
            grpc.StatusCode.NOT_FOUND,
            "unknown agent 'nobody' (configured: ['assistant', 'concise', 'slow'])",
        ),
        (
            apb.GenerateRequest(agent_id="assistant"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "give 'messages' or 'text'",
        ),
        (
            apb.GenerateRequest(agent_id="assistant", text="hi", max_steps=0),
            grpc.StatusCode.INVALID_ARGUMENT,
            "max_steps: must be at least 1",
        ),
        (
            apb.GenerateRequest(agent_id="assistant", text="x" * MAX_BYTES),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            None,
        ),
    ],
)
async def test_grpc_errors_have_their_status_codes(
    stub: agrpc.AgentServiceAsyncStub,
    request_: apb.GenerateRequest,
    code: grpc.StatusCode,
    details: str | None,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Generate(request_, metadata=GRPC_AUTH)
    assert info.value.code() == code
    if details is not None:
        assert info.value.details() == details


async def test_grpc_health_is_serving_and_needs_no_key(service: Service) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "procmesh.v1.AgentService"):
            response = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING, name
