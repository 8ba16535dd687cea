"""Readiness follows the sidecars; a drain refuses new runs and lets in-flight runs finish.

One `Service` per module over two real sidecar processes: ``guards`` (used by the
agents) and ``spare`` (configured, stopped and restarted by a test). The drain test
ends the module's service, so it comes last.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable

import grpc
import httpx
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.integration.service.support import (
    API_KEYS,
    AUTH,
    GRPC_AUTH,
    demo_answer,
    service_config,
    sse_events,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
DELAY_MS = 60  # the slow agent's answer has 22 deltas: about 1.3 s per run


async def eventually(check: Callable[[], object], timeout: float = 10.0) -> None:
    """Call `check()` until it returns truthy (a coroutine function is awaited)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sidecars(start_sidecar: Callable[..., SidecarProcess]) -> dict[str, SidecarProcess]:
    procs = {name: start_sidecar("examples", name=f"life-{name}") for name in ("guards", "spare")}
    for proc in procs.values():
        await proc.wait_ready()
    return procs


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(sidecars: dict[str, SidecarProcess]) -> AsyncIterator[Service]:
    settings = OrchestratorSettings(
        http_port=0,
        grpc_port=0,
        api_keys=[SecretStr(API_KEYS)],
        health_poll_seconds=0.1,
        drain_grace_seconds=10,
    )
    config = service_config({name: proc.address for name, proc in sidecars.items()}, delay_ms=DELAY_MS)
    # An agent guarded by the spare sidecar (fail-closed): its runs fail while the spare is down.
    config["agents"]["spare-guarded"] = {
        "model": "demo",
        "errorProcessorDefaults": False,
        "inputProcessors": [{"processor": "spare/topic-guard", "timeout": 1}],
    }
    async with Service(settings, parse_config(config)) as svc:
        yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{service.http_port}", headers=AUTH, timeout=10
    ) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def channel(service: Service) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as chan:
        yield chan


async def health_status(channel: grpc.aio.Channel, name: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
    return int(response.status)


async def test_readiness_and_health_follow_every_sidecar(
    service: Service,
    sidecars: dict[str, SidecarProcess],
    http: httpx.AsyncClient,
    channel: grpc.aio.Channel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    assert (await http.get("/readyz")).status_code == 200
    assert await health_status(channel) == SERVING

    sidecars["spare"].stop(grace=2.0)
    await eventually(lambda: service.health.not_serving)
    ready = await http.get("/readyz")
    assert ready.status_code == 503
    assert ready.json() == {
        "status": "not ready",
        "error": "sidecars not serving: spare is UNREACHABLE",
        "notServing": {"spare": "UNREACHABLE"},
        "configVersion": service.app.version,
    }
    for name in ("", "procmesh.v1.AgentService"):
        assert await health_status(channel, name) == NOT_SERVING
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        m.startswith("not serving: sidecar spare (unix://") and m.endswith("is UNREACHABLE") for m in warnings
    )
    metrics = (await http.get("/metrics")).text
    assert 'procmesh_sidecar_serving{sidecar="spare"} 0.0' in metrics
    assert (await http.get("/healthz")).status_code == 200  # alive, just not ready
    # Runs that do not need the missing sidecar still work.
    generated = await http.post("/api/agents/assistant/generate", json={"messages": "hello"})
    assert generated.json()["finishReason"] == "stop"
    await _runs_through_the_missing_sidecar_fail_clearly(http, channel)

    sidecars["spare"].start()
    await sidecars["spare"].wait_ready()
    await eventually(lambda: service.health.serving)
    assert (await http.get("/readyz")).status_code == 200

    async def grpc_serving() -> bool:
        return await health_status(channel) == int(SERVING)

    await eventually(grpc_serving)
    assert any(r.getMessage().startswith("every sidecar is SERVING again") for r in caplog.records)


async def _runs_through_the_missing_sidecar_fail_clearly(
    http: httpx.AsyncClient, channel: grpc.aio.Channel
) -> None:
    """Fail-closed: the result (HTTP 200, gRPC OK) carries an error naming processor and hook."""
    failed = await http.post("/api/agents/spare-guarded/generate", json={"messages": "hello"})
    assert failed.status_code == 200
    body = failed.json()
    assert body["finishReason"] == "error"
    assert body["text"] == ""
    assert body["error"].startswith("processor 'topic-guard' failed in process_input: ")
    events = [e async for e in _stream(http, "spare-guarded")]
    assert events[-1] == "[DONE]"
    kinds = [json.loads(e)["type"] for e in events[:-1]]
    assert kinds == ["start", "error", "finish"]
    error = json.loads(events[1])["payload"]["message"]
    assert error.startswith("processor 'topic-guard' failed in process_input: ")
    assert json.loads(events[2])["payload"]["finishReason"] == "error"
    stub = agrpc.AgentServiceStub(channel)
    response = await stub.Generate(
        apb.GenerateRequest(agent_id="spare-guarded", text="hi"), metadata=GRPC_AUTH
    )
    assert response.finish_reason == "error"
    assert response.error.startswith("processor 'topic-guard' failed in process_input: ")


async def _stream(http: httpx.AsyncClient, agent: str) -> AsyncIterator[str]:
    async with http.stream("POST", f"/api/agents/{agent}/stream", json={"messages": "hello"}) as response:
        assert response.status_code == 200
        async for data in sse_events(response):
            yield data


async def test_drain_refuses_new_runs_and_lets_running_ones_finish(
    service: Service, http: httpx.AsyncClient, channel: grpc.aio.Channel
) -> None:
    stub = agrpc.AgentServiceStub(channel)
    first_delta = asyncio.Event()
    http_chunks: list[object] = []

    async def http_stream() -> None:
        async with http.stream("POST", "/api/agents/slow/stream", json={"messages": "hello"}) as response:
            async for data in sse_events(response):
                http_chunks.append(data if data == "[DONE]" else json.loads(data))
                if data != "[DONE]" and json.loads(data)["type"] == "text-delta":
                    first_delta.set()

    async def grpc_stream() -> list[dict[str, object]]:
        request = apb.StreamRequest(agent_id="slow", text="hello")
        return [
            convert.chunk_from_proto(r.chunk)
            async for r in stub.Stream(request, metadata=GRPC_AUTH)
            if r.HasField("chunk")  # the last message carries only the run's status
        ]

    running_http = asyncio.create_task(http_stream())
    running_grpc = asyncio.create_task(grpc_stream())
    await asyncio.wait_for(first_delta.wait(), 10)
    await eventually(lambda: service.gate.active == 2)

    draining = asyncio.create_task(service.drain())
    await eventually(lambda: service.gate.draining)
    ready = await http.get("/readyz")
    assert (ready.status_code, ready.json()) == (
        503,
        {"status": "draining", "configVersion": service.app.version},
    )
    refused = await http.post("/api/agents/assistant/generate", json={"messages": "hi"})
    assert refused.status_code == 503
    assert refused.json() == {
        "error": "the server is shutting down and takes no new runs; retry on another replica"
    }
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Generate(apb.GenerateRequest(agent_id="assistant", text="hi"), metadata=GRPC_AUTH)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await health_status(channel) == NOT_SERVING
    assert not draining.done()  # still waiting for the two runs

    assert await asyncio.wait_for(draining, 10) is True
    await running_http
    grpc_chunks = await running_grpc
    answer = demo_answer("hello")
    assert http_chunks[-1] == "[DONE]"
    assert http_chunks[-2]["type"] == "finish"  # type: ignore[index]
    assert "".join(c["payload"]["text"] for c in http_chunks[:-1] if c["type"] == "text-delta") == answer  # type: ignore[index]
    assert grpc_chunks[-1]["type"] == "finish"
    assert "".join(c["payload"]["text"] for c in grpc_chunks if c["type"] == "text-delta") == answer  # type: ignore[index]
    assert service.gate.active == 0
