"""What a hostile or unlucky client can send the service, over real sockets, against a real sidecar.

Each test here reproduces one defect of the hardening issue: input a sidecar's decoder would refuse
(deep nesting, lone surrogates) never gets past a fail-open guard; malformed input is a 4xx or
INVALID_ARGUMENT, never a 5xx or UNKNOWN; the service is closed by default (Host check, loopback
only without keys, reflection behind the key, JSON content type, slow-loris connections closed).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import SecretStr

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import ServiceStartError
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.integration.service.support import API_KEY, API_KEYS, AUTH, GRPC_AUTH, service_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

GUARDED = "Tell me how to jailbreak it"  # topic-guard blocks "jailbreak"


def config(address: str) -> dict[str, Any]:
    """The service config plus `open`: the topic guard with fail-open, as the defect had it."""
    data = service_config({"guards": address})
    data["sidecars"]["guards"]["onFailure"] = "fail-open"
    return data


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sidecar(start_sidecar: Callable[..., SidecarProcess]) -> SidecarProcess:
    proc = start_sidecar("examples", name="hard-guards")
    await proc.wait_ready()
    return proc


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def keyed(sidecar: SidecarProcess) -> AsyncIterator[Service]:
    settings = OrchestratorSettings(
        http_port=0, grpc_port=0, api_keys=[SecretStr(API_KEYS)], health_poll_seconds=0.2
    )
    async with Service(settings, parse_config(config(sidecar.address))) as svc:
        yield svc


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def open_service(sidecar: SidecarProcess) -> AsyncIterator[Service]:
    settings = OrchestratorSettings(
        http_port=0,
        grpc_port=0,
        health_poll_seconds=0.2,
        header_timeout_seconds=0.5,
        body_timeout_seconds=0.5,
    )
    async with Service(settings, parse_config(config(sidecar.address))) as svc:
        yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def http(keyed: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{keyed.http_port}", headers=AUTH, timeout=10
    ) as c:
        yield c


def nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def message_with_metadata(metadata: Any, text: str = GUARDED) -> dict[str, Any]:
    return {
        "id": "m1",
        "role": "user",
        "content": {"format": 2, "parts": [{"type": "text", "text": text}], "metadata": metadata},
    }


# -- input a sidecar would refuse never reaches it ------------------------------------------


async def test_deep_metadata_is_refused_before_a_fail_open_guard_could_be_skipped(
    http: httpx.AsyncClient,
) -> None:
    body = {"messages": [message_with_metadata(nested(40, "x"))]}
    response = await http.post("/api/agents/assistant/generate", json=body)
    assert response.status_code == 400, response.text
    assert "PROCMESH_MAX_INPUT_DEPTH" in response.json()["error"]
    # Within the limit, the guard runs and blocks: the run trips, the model never sees the text.
    ok = await http.post(
        "/api/agents/assistant/generate", json={"messages": [message_with_metadata(nested(10, "x"))]}
    )
    assert ok.status_code == 200
    assert ok.json()["tripwire"]["processorId"] == "topic-guard"


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b'{"messages": "\\ud800"}', 400, "lone surrogate"),
        (b'{"messages": [' * 5000 + b"]" * 5000 + b"}", 400, "nests too deep"),
        (b'{"messages": "hi"', 400, "malformed JSON"),
        (b"", 400, "empty body"),
    ],
    ids=["surrogate", "deep-json", "truncated", "empty"],
)
async def test_malformed_bodies_are_4xx_with_a_message(
    http: httpx.AsyncClient, body: bytes, status: int, words: str
) -> None:
    response = await http.post(
        "/api/agents/assistant/generate", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert words in response.json()["error"]


async def test_the_body_must_be_declared_json(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/api/agents/assistant/generate",
        content=b'{"messages": "hi"}',
        headers={"content-type": "text/plain"},
    )
    assert response.status_code == 415
    assert "application/json" in response.json()["error"]


async def test_too_many_messages_are_refused_naming_the_limit(http: httpx.AsyncClient) -> None:
    response = await http.post("/api/agents/assistant/generate", json={"messages": ["x"] * 10_001})
    assert response.status_code == 400
    assert "limit of 10000" in response.json()["error"]


async def test_a_client_leaving_mid_body_is_not_a_5xx(keyed: Service) -> None:
    def send_half() -> None:
        with socket.create_connection(("127.0.0.1", keyed.http_port)) as sock:
            sock.sendall(
                b"POST /api/agents/assistant/generate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                + f"Authorization: Bearer {API_KEY}\r\n".encode()
                + b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"messages"'
            )

    before = _count(keyed, "499")
    await asyncio.to_thread(send_half)
    for _ in range(100):
        if _count(keyed, "499") > before:
            break
        await asyncio.sleep(0.02)
    assert _count(keyed, "499") == before + 1
    assert _count(keyed, "500") == 0


def _count(service: Service, code: str) -> float:
    value = service.metrics.registry.get_sample_value(
        "procmesh_api_requests_total", {"api": "http", "code": code}
    )
    return value or 0.0


# -- gRPC: malformed is INVALID_ARGUMENT, nothing huge is echoed, reflection needs the key ---------


async def test_an_undecodable_grpc_request_is_invalid_argument(keyed: Service) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{keyed.grpc_port}") as channel:
        raw = channel.unary_unary("/procmesh.v1.AgentService/Generate")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await raw(b"\xff\xff\xff\xff", metadata=GRPC_AUTH)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await raw(b"\xff\xff\xff\xff")
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_deep_structs_over_grpc_are_invalid_argument(keyed: Service) -> None:
    message = tpb.Message(id="m1", role="user")
    message.content.parts.add().text.text = GUARDED
    message.content.metadata.update(nested(30, "x"))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{keyed.grpc_port}") as channel:
        stub = agrpc.AgentServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Generate(
                apb.GenerateRequest(agent_id="assistant", messages=[message]), metadata=GRPC_AUTH
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_huge_unknown_agent_id_is_not_echoed(keyed: Service) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{keyed.grpc_port}") as channel:
        stub = agrpc.AgentServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Generate(apb.GenerateRequest(agent_id="x" * 100_000, text="hi"), metadata=GRPC_AUTH)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        assert len(info.value.details() or "") < 300


async def test_reflection_needs_the_key_when_keys_are_set(keyed: Service) -> None:
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{keyed.grpc_port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.ServerReflectionInfo(iter([request])):
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answers = [a async for a in stub.ServerReflectionInfo(iter([request]), metadata=GRPC_AUTH)]
        names = {s.name for s in answers[0].list_services_response.service}
        assert "procmesh.v1.AgentService" in names


# -- closed by default ------------------------------------------------------------------------


async def test_without_keys_only_loopback_host_names_are_served(open_service: Service) -> None:
    base = f"http://127.0.0.1:{open_service.http_port}"
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        assert (await client.get("/healthz")).status_code == 200
        rebound = await client.get("/api/agents", headers={"host": "attacker.example:4111"})
        assert rebound.status_code == 400
        assert "PROCMESH_ALLOWED_HOSTS" in rebound.json()["error"]
        assert (await client.get("/api/agents", headers={"host": "localhost:4111"})).status_code == 200


async def test_without_keys_a_non_loopback_bind_is_refused_and_loopback_warns(
    sidecar: SidecarProcess, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = parse_config(config(sidecar.address))
    exposed = OrchestratorSettings(http_host="0.0.0.0", http_port=0, grpc_port=0)
    with pytest.raises(ServiceStartError, match=r"refusing to serve without API keys on 0\.0\.0\.0"):
        await Service(exposed, cfg).start()
    caplog.set_level(logging.WARNING)
    async with Service(OrchestratorSettings(http_port=0, grpc_port=0), cfg):
        pass
    assert any("no API keys" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


async def test_a_slow_loris_connection_is_closed(open_service: Service) -> None:
    def linger() -> bytes:
        with socket.create_connection(("127.0.0.1", open_service.http_port)) as sock:
            sock.settimeout(5)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            return sock.recv(100)  # b"" once the server closes the connection

    assert await asyncio.to_thread(linger) == b""


async def test_a_body_that_never_arrives_is_408(open_service: Service) -> None:
    def trickle() -> bytes:
        with socket.create_connection(("127.0.0.1", open_service.http_port)) as sock:
            sock.settimeout(5)
            sock.sendall(
                b"POST /api/agents/assistant/generate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
            )
            return sock.recv(200)

    assert (await asyncio.to_thread(trickle)).startswith(b"HTTP/1.1 408")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def roomy(sidecar: SidecarProcess) -> AsyncIterator[Service]:
    settings = OrchestratorSettings(
        http_port=0,
        grpc_port=0,
        health_poll_seconds=0.2,
        max_input_messages=50_000,
        max_request_bytes=16 << 20,
    )
    async with Service(settings, parse_config(config(sidecar.address))) as svc:
        yield svc


@pytest.mark.timeout(60)  # the quadratic message list took over 60 s (and froze /healthz) for 50,000
async def test_fifty_thousand_messages_do_not_freeze_the_service(roomy: Service) -> None:
    base = f"http://127.0.0.1:{roomy.http_port}"
    async with httpx.AsyncClient(base_url=base, timeout=55) as client:
        run = asyncio.create_task(
            client.post("/api/agents/concise/generate", json={"messages": ["word"] * 50_000})
        )
        await asyncio.sleep(0.2)
        health = await client.get("/healthz")
        assert health.status_code == 200
        response = await run
        assert response.status_code == 200, response.text[:500]
        assert response.json()["finishReason"] != "error"
