"""Helpers shared by the service tests (integration and e2e): configs, clients, SSE parsing, ports."""

from __future__ import annotations

import contextlib
import json
import re
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from google.protobuf import struct_pb2
from pydantic import BaseModel, Field

from procmesh import Processor
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc

if TYPE_CHECKING:
    from procmesh_orchestrator.service import Service

API_KEY = "test-key-0123456789"
API_KEYS = f"{API_KEY}=@operator"
"""``PROCMESH_API_KEYS`` for `API_KEY`: an operator key (a key is bound to a resource or has a role)."""
AUTH = {"Authorization": f"Bearer {API_KEY}"}
GRPC_AUTH = (("authorization", f"Bearer {API_KEY}"),)
SECRET = "zebra-quartz-4711"
"""User content that must never appear in metric labels or INFO logs."""


def demo_answer(text: str) -> str:
    """What the demo model answers to `text` (before any output processor)."""
    return (
        f'You said: "{text}" Darn, this demo model always answers at some length, '
        "because it wants to show every processor at work in one stream."
    )


def service_config(sidecars: dict[str, str], *, delay_ms: float = 0.0) -> dict[str, Any]:
    """Agents over the `examples` sidecar named ``guards``: plain, guarded, slow, retrying."""
    return {
        "sidecars": {name: {"address": address} for name, address in sidecars.items()},
        "models": {"demo": {"provider": "demo"}, "slow": {"provider": "demo", "delayMs": delay_ms}},
        "agents": {
            "assistant": {
                "instructions": "You are helpful.",
                "model": "demo",
                "errorProcessorDefaults": False,
                "inputProcessors": [{"processor": "guards/topic-guard", "options": {"words": ["jailbreak"]}}],
                "outputProcessors": [{"processor": "guards/word-filter", "options": {"words": ["darn"]}}],
            },
            "concise": {
                "instructions": "Be brief.",
                "model": "demo",
                "errorProcessorDefaults": False,
                "maxProcessorRetries": 2,
                "outputProcessors": [{"processor": "guards/length-check", "options": {"max_words": 12}}],
            },
            "slow": {"model": "slow", "errorProcessorDefaults": False},
        },
    }


async def sse_events(response: httpx.Response) -> AsyncIterator[str]:
    """The ``data:`` payloads of a text/event-stream response, in order (``[DONE]`` included)."""
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        while "\n\n" in buffer:
            event, buffer = buffer.split("\n\n", 1)
            for line in event.splitlines():
                if line.startswith("data: "):
                    yield line[len("data: ") :]


async def stream_chunks(client: httpx.AsyncClient, agent: str, body: dict[str, Any]) -> list[Any]:
    """POST /stream and return every event: chunk dicts, then the string ``[DONE]``."""
    out: list[Any] = []
    async with client.stream("POST", f"/api/agents/{agent}/stream", json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        async for data in sse_events(response):
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (for servers that cannot report theirs)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_client(service: Service, headers: dict[str, str], timeout: float = 20) -> httpx.AsyncClient:
    """A client of an in-process `Service`'s HTTP API, calling with `headers`."""
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{service.http_port}", headers=headers, timeout=timeout
    )


@contextlib.asynccontextmanager
async def agent_stub(service: Service) -> AsyncIterator[agrpc.AgentServiceAsyncStub]:
    """An `AgentService` stub on a channel to an in-process `Service`'s gRPC port."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        yield agrpc.AgentServiceStub(channel)


async def grpc_generate_refused(service: Service, context: dict[str, Any], key: str) -> grpc.aio.AioRpcError:
    """`Generate` (agent ``a``, text ``hi``) with the request context `context`, over gRPC with
    the API key `key`: the error it must fail with."""
    request_context = struct_pb2.Struct()
    request_context.update(context)
    request = apb.GenerateRequest(agent_id="a", text="hi", request_context=request_context)
    async with agent_stub(service) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Generate(request, metadata=(("authorization", f"Bearer {key}"),))
    return info.value


async def settings_ignored(http: httpx.AsyncClient, setting: str) -> float:
    """``procmesh_call_settings_ignored_total{setting}`` now (0 before its first count)."""
    metrics = (await http.get("/metrics")).text
    found = re.search(rf'^procmesh_call_settings_ignored_total{{setting="{setting}"}} (\S+)$', metrics, re.M)
    return float(found.group(1)) if found else 0.0


class BudgetOptions(BaseModel):
    limit: int = Field(gt=0)


class Budget(Processor):
    """Reports the limit it was given, as a violation the response carries."""

    id = "budget"
    Options = BudgetOptions

    async def process_input(self, messages: list[Any], options: BudgetOptions, report_violation: Any) -> None:
        report_violation(f"limit {options.limit}", {"limit": options.limit})
