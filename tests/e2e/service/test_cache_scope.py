"""The response cache never crosses tenants (issue 24, finding 5): its scope is the caller's
resource as the server knows it (the API key's), never something the caller sends.

A real ``procmesh-sidecar response-cache`` process (in-memory backend) behind an in-process
`Service` whose keys are bound to ``tenant-a`` and ``tenant-b``; the server trusts every caller for
every request-context key that is not reserved (``PROCMESH_TRUSTED_CONTEXT={"*": ["*"]}``), the
most a deployment can trust. The scripted model answers each call differently, so a cached answer
is told apart from a fresh one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.sidecar_process import SidecarProcess

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}
ASK = {"messages": "what is my account secret?"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(start_sidecar: Callable[..., SidecarProcess]) -> AsyncIterator[httpx.AsyncClient]:
    sidecar = start_sidecar("response-cache", name="cache-scope")
    await sidecar.wait_ready()
    config = {
        "sidecars": {"cache": {"address": sidecar.address, "timeout": 10}},
        "models": {
            "scripted": {
                "provider": "scripted",
                "responses": [{"text": f"answer number {i}"} for i in range(1, 20)],
            }
        },
        "agents": {
            "chat": {
                "model": "scripted",
                "errorProcessorDefaults": False,
                "inputProcessors": [{"processor": "cache/response-cache"}],  # no scope: the resource's
            }
        },
    }
    settings = OrchestratorSettings(
        http_port=0,
        grpc_port=0,
        api_keys=[SecretStr("key-a=tenant-a"), SecretStr("key-b=tenant-b")],
        trusted_context={"*": ["*"]},
    )
    async with (
        Service(settings, parse_config(config)) as service,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}", timeout=30) as client,
    ):
        yield client


async def _text(http: httpx.AsyncClient, headers: dict[str, str], body: dict[str, Any]) -> str:
    response = await http.post("/api/agents/chat/generate", json=body, headers=headers)
    assert response.status_code == 200, response.text
    text: str = response.json()["text"]
    return text


async def test_tenant_b_is_never_served_tenant_as_cached_answer(http: httpx.AsyncClient) -> None:
    first = await _text(http, A, ASK)
    assert await _text(http, A, ASK) == first  # A's answer is cached, for A
    # B asks the same: the cache is scoped by B's resource, so B gets a fresh answer
    assert await _text(http, B, ASK) != first
    # B names A's scope (or a key of its own) in the request context: refused, naming the key
    for name in ("responseCache", "mastra__response_cache_context"):
        for per_call in ({"scope": "tenant-a"}, {"key": "anything"}, {"scope": None}):
            trick = await http.post(
                "/api/agents/chat/generate", json={**ASK, "requestContext": {name: per_call}}, headers=B
            )
            assert trick.status_code == 400, trick.text
            assert trick.json()["error"].startswith(f"requestContext: '{name}' reserved")
    resource = await http.post(
        "/api/agents/chat/generate",
        json={**ASK, "requestContext": {"mastra__resourceId": "tenant-a"}},
        headers=B,
    )
    assert resource.status_code == 400
    # and nothing B did reached A's entry or served it to B
    assert await _text(http, A, ASK) == first
    assert await _text(http, B, ASK) != first
