"""The model gateway over the pod's unix socket, reflection and malformed requests.

The orchestrator is started with ``--grpc-socket`` on a path where a crashed process left its
socket file; the judge sidecar reaches the gateway with ``PROCMESH_MODEL_GATEWAY=unix://...``
(no TCP address). Over that socket, server reflection lists ``procmesh.v1.ModelService``, and a
ModelService request that does not decode is INVALID_ARGUMENT, as for AgentService.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
import yaml
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import BIN
from tests.e2e.gateway.support import KEYS, gateway_calls, start_judge
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH, GRPC_AUTH

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


def _config(sidecar: str) -> dict[str, Any]:
    return {
        "sidecars": {"j": {"address": sidecar, "timeout": 10}},
        "models": {
            "main": {"provider": "scripted", "responses": [{"text": "fine"}] * 5},
            "judge-ok": {"provider": "scripted", "responses": [{"text": '{"allowed": true}'}] * 5},
        },
        "agents": {
            "guarded": {
                "model": "main",
                "errorProcessorDefaults": False,
                "inputProcessors": [{"processor": "j/judge", "options": {"model": "judge-ok"}}],
            }
        },
    }


@pytest.fixture(scope="module")
def gateway_socket(sidecar_dir: Path) -> Path:
    """A socket path holding a crashed process's socket file (bound, never unlinked)."""
    path = sidecar_dir / "orchestrator.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    return path


@pytest.fixture(scope="module")
def judge_sidecar(sidecar_dir: Path, gateway_socket: Path) -> Iterator[SidecarProcess]:
    proc = start_judge(sidecar_dir, f"unix://{gateway_socket}")  # the pod's socket, no TCP address
    yield proc
    proc.stop(grace=2.0)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    judge_sidecar: SidecarProcess,
    gateway_socket: Path,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    await judge_sidecar.wait_ready()
    return await asyncio.to_thread(
        start_orchestrator,
        _config(judge_sidecar.address),
        "--grpc-socket",
        str(gateway_socket),
        env={"PROCMESH_API_KEYS": KEYS},
    )


async def test_a_judge_reaches_the_gateway_over_the_unix_socket(
    orchestrator: OrchestratorProcess, gateway_socket: Path
) -> None:
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=30) as http:
        response = await http.post("/api/agents/guarded/generate", json={"messages": "hello"})
    body = response.json()
    assert body["status"] == "success", body
    assert body["text"] == "fine"
    assert gateway_calls(orchestrator)[("judge-ok", "judge", "ok")] == 1
    assert (
        f"and unix:{gateway_socket} (procmesh.v1.AgentService, procmesh.v1.ModelService" in orchestrator.log()
    )


async def test_reflection_over_the_socket_lists_the_model_service(
    orchestrator: OrchestratorProcess, gateway_socket: Path
) -> None:
    async with grpc.aio.insecure_channel(f"unix://{gateway_socket}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        answers = [a async for a in stub.ServerReflectionInfo(iter([request]), metadata=GRPC_AUTH)]
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"procmesh.v1.ModelService", "procmesh.v1.AgentService", "grpc.health.v1.Health"} <= names


async def test_a_model_request_that_does_not_decode_is_invalid_argument(
    orchestrator: OrchestratorProcess, gateway_socket: Path
) -> None:
    async with grpc.aio.insecure_channel(f"unix://{gateway_socket}") as channel:
        call: Any = channel.unary_unary("/procmesh.v1.ModelService/Generate")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"\xff\xff\xff", metadata=GRPC_AUTH, timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "malformed request: it does not decode"


async def test_a_socket_path_that_is_not_a_socket_stops_the_start(tmp_path: Path) -> None:
    occupied = tmp_path / "taken.sock"
    occupied.write_text("not a socket", encoding="utf-8")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"agents": {"a": {"model": "demo", "errorProcessorDefaults": False}}}))
    done = await asyncio.to_thread(
        subprocess.run,
        [
            str(BIN / "procmesh-orchestrator"),
            "--config",
            str(path),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--grpc-socket",
            str(occupied),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PROCMESH_API_KEYS": API_KEYS},
    )
    assert done.returncode == 2
    assert f"cannot bind the gRPC API to unix:{occupied}: the path exists and is not a socket" in done.stderr
    assert occupied.read_text(encoding="utf-8") == "not a socket", "the file is left as it was"
