"""`procmesh-orchestrator` as a real process: it serves both APIs, and SIGTERM drains it to exit 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import BIN
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import (
    API_KEYS,
    AUTH,
    GRPC_AUTH,
    demo_answer,
    service_config,
    sse_events,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

DELAY_MS = 100  # 22 deltas: the slow run takes about 2 s


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> OrchestratorProcess:
    sidecar = start_sidecar("examples", name="proc-guards")
    await sidecar.wait_ready()
    config = service_config({"guards": sidecar.address}, delay_ms=DELAY_MS)
    return await asyncio.to_thread(
        start_orchestrator, config, "--drain-grace-seconds", "20", env={"PROCMESH_API_KEYS": API_KEYS}
    )


async def test_the_process_serves_http_and_grpc(orchestrator: OrchestratorProcess) -> None:
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH) as http:
        response = await http.post("/api/agents/assistant/generate", json={"messages": "hello"})
        assert response.status_code == 200
        assert response.json()["text"] == demo_answer("hello").replace("Darn", "****")
        assert (await http.get("/api/agents", headers={"Authorization": "Bearer wrong"})).status_code == 401
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        stub = agrpc.AgentServiceStub(channel)
        result = await stub.Generate(
            apb.GenerateRequest(agent_id="assistant", text="jailbreak"), metadata=GRPC_AUTH
        )
        assert result.tripwire.processor_id == "topic-guard"
        health = health_pb2_grpc.HealthStub(channel)
        status = await health.Check(health_pb2.HealthCheckRequest(service="procmesh.v1.AgentService"))
        assert status.status == health_pb2.HealthCheckResponse.SERVING


async def test_sigterm_during_a_streamed_run_drains_it_and_exits_0(orchestrator: OrchestratorProcess) -> None:
    events: list[str] = []
    async with (
        httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http,
        http.stream("POST", "/api/agents/slow/stream", json={"messages": "hello"}) as response,
    ):
        assert response.status_code == 200
        async for data in sse_events(response):
            events.append(data)
            if len(events) == 4:  # start, step-start and two deltas: the run is under way
                orchestrator.proc.send_signal(signal.SIGTERM)
                await _assert_draining(orchestrator)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["type"] == "finish"
    assert "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta") == demo_answer("hello")
    assert await asyncio.to_thread(orchestrator.proc.wait, 15) == 0
    log = orchestrator.log()
    assert "SIGTERM: draining" in log
    assert "draining: 1 run(s) in flight, grace 20.0s" in log
    assert "drained: no run in flight" in log


async def _assert_draining(orchestrator: OrchestratorProcess) -> None:
    """While the run streams on: not ready, new runs refused over HTTP and gRPC, health NOT_SERVING."""
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH) as http:
        for _ in range(100):  # the signal is handled asynchronously
            ready = await http.get("/readyz")
            if ready.status_code == 503:
                break
            await asyncio.sleep(0.02)
        assert ready.json()["status"] == "draining"
        refused = await http.post("/api/agents/assistant/generate", json={"messages": "hi"})
        assert refused.status_code == 503
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        stub = agrpc.AgentServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Generate(apb.GenerateRequest(agent_id="assistant", text="hi"), metadata=GRPC_AUTH)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        health = health_pb2_grpc.HealthStub(channel)
        status = await health.Check(health_pb2.HealthCheckRequest(service=""))
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("agents: {a: {model: nope}}", "agents.a.model: unknown model 'nope'"),
        (None, "--config FILE (or PROCMESH_CONFIG_FILE) is required"),
    ],
)
async def test_a_bad_start_exits_2_saying_why(tmp_path: Path, config: str | None, message: str) -> None:
    args = [str(BIN / "procmesh-orchestrator"), "--http-port", "0", "--grpc-port", "0"]
    if config is not None:
        (tmp_path / "config.yaml").write_text(config, encoding="utf-8")
        args += ["--config", str(tmp_path / "config.yaml")]
    proc = await asyncio.to_thread(
        subprocess.run, args, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 2
    assert message in proc.stderr


async def test_the_config_file_comes_from_procmesh_config_file_and_the_old_name_is_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "config.yaml").write_text("agents: {a: {model: nope}}", encoding="utf-8")
    args = [str(BIN / "procmesh-orchestrator"), "--http-port", "0", "--grpc-port", "0"]

    def start(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, capture_output=True, text=True, timeout=60, check=False, env={**os.environ, **env}
        )

    read = await asyncio.to_thread(start, PROCMESH_CONFIG_FILE=str(tmp_path / "config.yaml"))
    assert read.returncode == 2
    assert "agents.a.model: unknown model 'nope'" in read.stderr  # the file was read
    old = await asyncio.to_thread(start, PROCMESH_CONFIG=str(tmp_path / "config.yaml"))
    assert old.returncode == 2
    assert "PROCMESH_CONFIG was renamed PROCMESH_CONFIG_FILE" in old.stderr
