"""/readyz waits for the sidecars a run needs, not for fail-open ones; /metrics times HTTP requests.

A fail-open sidecar that is down degrades runs (its processors are skipped), it does not fail
them, so it must not take the pod out of its Service: /readyz stays 200 and names it under
``degraded``. A fail-closed sidecar still makes it 503 (test_lifecycle.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import httpx
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.integration.service.support import API_KEYS, AUTH, service_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sidecars(start_sidecar: Callable[..., SidecarProcess]) -> dict[str, SidecarProcess]:
    procs = {name: start_sidecar("examples", name=f"ready-{name}") for name in ("guards", "optional")}
    for proc in procs.values():
        await proc.wait_ready()
    return procs


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(sidecars: dict[str, SidecarProcess]) -> AsyncIterator[Service]:
    settings = OrchestratorSettings(
        http_port=0, grpc_port=0, api_keys=[SecretStr(API_KEYS)], health_poll_seconds=0.1
    )
    config = service_config({name: proc.address for name, proc in sidecars.items()})
    config["sidecars"]["optional"]["on_failure"] = "fail-open"
    async with Service(settings, parse_config(config)) as svc:
        yield svc


async def test_a_fail_open_sidecar_down_leaves_the_pod_ready(
    service: Service, sidecars: dict[str, SidecarProcess]
) -> None:
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{service.http_port}", headers=AUTH, timeout=10
    ) as http:
        assert (await http.get("/readyz")).json()["status"] == "ready"
        sidecars["optional"].stop(grace=1.0)
        deadline = asyncio.get_running_loop().time() + 10
        # A poll made while it drained may see NOT_SERVING first; gone, it is UNREACHABLE
        while service.health.not_serving.get("optional") != "UNREACHABLE":
            assert asyncio.get_running_loop().time() < deadline, "the poll never saw the sidecar go"
            await asyncio.sleep(0.05)
        ready = await http.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["status"] == "ready"
        assert ready.json()["degraded"] == {"optional": "UNREACHABLE"}
        # The orchestrator's own grpc.health.v1 follows the same verdict as /readyz.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
        assert (await http.post("/api/agents/assistant/generate", json={"messages": "hi"})).status_code == 200
        assert (await http.get("/api/agents/nobody")).status_code == 404

        metrics = (await http.get("/metrics")).text
    # Latency by route template and code: the agent id never becomes a label value.
    count = "procmesh_http_request_duration_seconds_count"
    assert f'{count}{{code="200",route="/readyz"}} 2.0' in metrics
    assert f'{count}{{code="200",route="/api/agents/{{agent_id}}/generate"}} 1.0' in metrics
    assert f'{count}{{code="404",route="/api/agents/{{agent_id}}"}} 1.0' in metrics
    assert "nobody" not in metrics
    assert "procmesh_orchestrator_build_info{" in metrics
    assert "process_cpu_seconds_total" in metrics
