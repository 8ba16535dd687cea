"""Model fallbacks end to end: an orchestrator process whose agent lists two models served by two
real HTTP servers speaking the OpenAI chat-completions API (`tests/integration/providers/fakes.py`).

The primary answers 503 every time. It has its own retry (``maxRetries: 1``), and the default
error processors (stream-error-retry-processor) get their turn; when none of them recovered the
call, the fallback answers. The result (HTTP and gRPC) and the metrics say which model did.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.providers.fakes import FakeOpenAI, error
from tests.integration.service.support import API_KEY, API_KEYS, AUTH

pytestmark = pytest.mark.e2e

UNAVAILABLE = {**error(503, "The server is overloaded.", kind="server_error"), "status": 503}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[FakeOpenAI, FakeOpenAI]]:
    primary, backup = FakeOpenAI(), FakeOpenAI()
    primary.start()
    backup.start()
    primary.script("big", UNAVAILABLE)
    backup.script("small", {"text": "from the fallback", "usage": [7, 3]})
    backup.script("broken", {**error(500, "Internal error.", kind="server_error"), "status": 500})
    yield primary, backup
    primary.stop()
    backup.stop()


@pytest.fixture(scope="module")
def orchestrator(
    servers: tuple[FakeOpenAI, FakeOpenAI], start_orchestrator: Callable[..., OrchestratorProcess]
) -> OrchestratorProcess:
    primary, backup = servers
    config: dict[str, Any] = {
        "providers": {
            # the model entry's own retries wait the provider's backoff
            "primary": {"kind": "openai", "baseUrl": primary.base_url, "retryBackoffMs": 10},
            "backup": {"kind": "openai", "baseUrl": backup.base_url},
        },
        "agents": {
            "resilient": {
                "model": [
                    {"model": "primary/big", "maxRetries": 1},
                    {"model": "backup/unused", "enabled": False},
                    {"model": "backup/small"},
                ],
            },
            "doomed": {"model": [{"model": "primary/big"}, {"model": "backup/broken"}]},
        },
    }
    return start_orchestrator(config, env={"PROCMESH_API_KEYS": API_KEYS})


def _fallbacks(orchestrator: OrchestratorProcess) -> dict[tuple[str, str, str], float]:
    text = httpx.get(f"{orchestrator.http_url}/metrics", headers=AUTH).text
    return {
        (s.labels["agent"], s.labels["failed"], s.labels["next"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "procmesh_model_fallbacks_total"
    }


def test_a_primary_that_fails_with_503_hands_the_call_to_the_fallback(
    orchestrator: OrchestratorProcess, servers: tuple[FakeOpenAI, FakeOpenAI]
) -> None:
    primary, backup = servers
    response = httpx.post(
        f"{orchestrator.http_url}/api/agents/resilient/generate", json={"messages": "hi"}, headers=AUTH
    )
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "success"
    assert body["text"] == "from the fallback"
    assert body["response"]["modelId"] == "backup/small"
    # the primary's own retry (2 requests), then stream-error-retry's one retry (2 more)
    calls = len(primary.calls("big"))
    print(f"\nfallback: primary requests {calls}, fallback requests {len(backup.calls('small'))}")
    assert calls == 4
    assert len(backup.calls("small")) == 1
    assert backup.calls("unused") == [], "a disabled model never gets a turn"
    assert _fallbacks(orchestrator) == {("resilient", "primary/big", "backup/small"): 1}

    # streamed: the same, and the stream carries the fallback's text
    text = httpx.post(
        f"{orchestrator.http_url}/api/agents/resilient/stream", json={"messages": "hi"}, headers=AUTH
    ).text
    events = [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]
    deltas = "".join(e["payload"]["text"] for e in events if e.get("type") == "text-delta")
    assert deltas == "from the fallback"
    assert [e["payload"]["finishReason"] for e in events if e.get("type") == "finish"] == ["stop"]


def test_when_every_model_fails_the_run_fails_with_the_last_models_error(
    orchestrator: OrchestratorProcess,
) -> None:
    response = httpx.post(
        f"{orchestrator.http_url}/api/agents/doomed/generate", json={"messages": "hi"}, headers=AUTH
    )
    body = response.json()
    assert body["status"] == "failed"
    assert "Internal error." in body["error"]
    assert _fallbacks(orchestrator)[("doomed", "primary/big", "backup/broken")] == 1


def test_the_grpc_result_names_the_fallback_that_answered(orchestrator: OrchestratorProcess) -> None:
    with grpc.insecure_channel(orchestrator.grpc_address) as channel:
        response = agrpc.AgentServiceStub(channel).Generate(
            apb.GenerateRequest(agent_id="resilient", text="hi"),
            metadata=(("authorization", f"Bearer {API_KEY}"),),
            timeout=30,
        )
    assert response.status == "success", response.error
    assert response.text == "from the fallback"
    assert response.model_id == "backup/small"
