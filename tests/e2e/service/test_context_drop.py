"""``PROCMESH_UNTRUSTED_CONTEXT=drop`` on a real ``procmesh-orchestrator``: over HTTP (generate and
an SSE stream) and gRPC, keys the caller is not trusted for and keys the agent does not declare are
dropped and named (header, initial metadata, one WARNING each, the counter on /metrics); a reserved
key is still refused; a misspelt mode stops the start naming the setting."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from google.protobuf import struct_pb2
from prometheus_client.parser import text_string_to_metric_families

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as apb_grpc
from tests.conftest import BIN
from tests.e2e.service.conftest import OrchestratorProcess

pytestmark = pytest.mark.e2e

HEADER = "X-Procmesh-Dropped-Context"
CONFIG: dict[str, Any] = {
    "models": {"demo": {"provider": "demo"}},
    "agents": {
        "a": {
            "model": "demo",
            "errorProcessorDefaults": False,
            "requestContextSchema": {
                "properties": {"tenant": {"type": "string"}, "tier": {"type": "string"}}
            },
        }
    },
}
ENV = {
    "PROCMESH_API_KEYS": "k-acme=acme",
    "PROCMESH_TRUSTED_CONTEXT": '{"acme": ["tenant", "region"]}',
    "PROCMESH_UNTRUSTED_CONTEXT": "drop",
}


@pytest.fixture(scope="module")
def orchestrator(start_orchestrator: Callable[..., OrchestratorProcess]) -> OrchestratorProcess:
    return start_orchestrator(CONFIG, env=ENV)


def _dropped_total(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "procmesh_request_context_dropped_total" and s.labels == {"agent": "a"}
    )


def test_http_generate_and_stream_name_what_they_dropped(orchestrator: OrchestratorProcess) -> None:
    # tier: declared, not trusted; region: trusted, not declared; both dropped, tenant kept
    context = {"tenant": "acme", "tier": "gold", "region": "eu"}
    with httpx.Client(base_url=orchestrator.http_url, headers={"Authorization": "Bearer k-acme"}) as http:
        before = _dropped_total(http)
        body = {"messages": "hi", "requestContext": context}
        generated = http.post("/api/agents/a/generate", json=body)
        assert generated.status_code == 200, generated.text
        assert generated.headers[HEADER] == "region, tier"
        with http.stream("POST", "/api/agents/a/stream", json=body) as streamed:
            assert streamed.status_code == 200
            assert streamed.headers["content-type"].startswith("text/event-stream")
            assert streamed.headers[HEADER] == "region, tier"
            assert "data: [DONE]" in streamed.read().decode()
        trusted = http.post(
            "/api/agents/a/generate", json={"messages": "hi", "requestContext": {"tenant": "x"}}
        )
        assert trusted.status_code == 200
        assert HEADER not in trusted.headers
        reserved = http.post(
            "/api/agents/a/generate", json={"messages": "hi", "requestContext": {"resourceId": "globex"}}
        )
        assert reserved.status_code == 400
        assert "'resourceId' reserved" in reserved.json()["error"]
        assert _dropped_total(http) == before + 2
    lines = [line for line in orchestrator.log().splitlines() if "http agent=a: requestContext" in line]
    assert len(lines) == 2
    assert all("WARNING" in line and "'region', 'tier' dropped" in line for line in lines)


async def test_grpc_names_them_in_the_initial_metadata(orchestrator: OrchestratorProcess) -> None:
    context = struct_pb2.Struct()
    context.update({"tenant": "acme", "debug": True})
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        stub = apb_grpc.AgentServiceStub(channel)
        call = stub.Generate(
            apb.GenerateRequest(agent_id="a", text="hi", request_context=context),
            metadata=(("authorization", "Bearer k-acme"),),
        )
        metadata = dict(await call.initial_metadata())
        response = await call
    assert metadata["x-procmesh-dropped-context"] == "debug"
    assert response.finish_reason == "stop"
    assert "grpc agent=a: requestContext 'debug' dropped" in orchestrator.log()


def test_a_misspelt_mode_stops_the_start(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    done = subprocess.run(
        [str(BIN / "procmesh-orchestrator"), "--config", str(config), "--http-port", "0", "--grpc-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **ENV, "PROCMESH_UNTRUSTED_CONTEXT": "ignore"},
    )
    assert done.returncode == 2
    assert "untrusted_context: Input should be 'refuse' or 'drop'" in done.stderr
