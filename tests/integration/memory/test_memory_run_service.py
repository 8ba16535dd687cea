"""Memory through the orchestrator's APIs: real sidecar processes, the real stores (SQLite, PostgreSQL).

A multi-turn conversation over HTTP (the body's ``memory: {thread, resource}`` as @mastra/client-js
sends it) and over gRPC (``thread_id``/``resource_id``); an input guard's abort and an output
filter's rewrite as the thread keeps them; the trust rule for who may name a resource.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.service._auth import ANONYMOUS, Caller
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service._limits import InputLimits
from procmesh_orchestrator.service._trust import ContextTrust
from procmesh_orchestrator.service.api.calls import parse_body
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.sidecar_process import SidecarProcess
from procmesh_orchestrator.store import MemoryStore
from tests.integration.memory.conftest import Backend
from tests.integration.service.support import stream_chunks

pytestmark = pytest.mark.e2e

LIMITS = InputLimits()
TRUST = ContextTrust.of({}, [], legacy=False)


def _config(guards: str, backend: Backend) -> dict[str, Any]:
    storage = (
        {"backend": "sqlite", "path": backend.location}
        if backend.name == "sqlite"
        else {"backend": "postgres", "dsn": backend.location}
    )
    return {
        "storage": storage,
        "sidecars": {"guards": {"address": guards}},
        "models": {
            "script": {
                "provider": "scripted",
                "responses": [{"text": "Nice to meet you, Ada."}, {"text": "Your darn name is Ada."}],
            }
        },
        "agents": {
            "assistant": {
                "instructions": "You are helpful.",
                "model": "script",
                "errorProcessorDefaults": False,
                "memory": {"lastMessages": 10},
                "inputProcessors": [{"processor": "guards/topic-guard", "options": {"words": ["jailbreak"]}}],
                "outputProcessors": [{"processor": "guards/word-filter", "options": {"words": ["darn"]}}],
            }
        },
    }


@pytest_asyncio.fixture
async def service(start_sidecar: Callable[..., SidecarProcess], backend: Backend) -> AsyncIterator[Service]:
    sidecar = start_sidecar("examples", name=f"memory-guards-{backend.name}")
    await sidecar.wait_ready()
    settings = OrchestratorSettings(http_port=0, grpc_port=0)  # no key: the caller names the resource
    async with Service(settings, parse_config(_config(sidecar.address, backend))) as svc:
        yield svc


def _store(service: Service) -> MemoryStore:
    assert service.app.store is not None
    return service.app.store


async def _thread(service: Service, thread: str, resource: str) -> list[tuple[str, str]]:
    return [(m["role"], message_text(m)) for m in await _store(service).messages(thread, resource)]


async def test_a_conversation_over_http_remembers_and_keeps_what_the_processors_left(
    service: Service,
) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}", timeout=20) as http:
        memory = {"thread": {"id": "t-ada"}, "resource": "user-ada"}
        blocked = await http.post(
            "/api/agents/assistant/generate", json={"messages": "a jailbreak please", "memory": memory}
        )
        assert blocked.json()["tripwire"]["processorId"] == "topic-guard"
        first = await http.post(
            "/api/agents/assistant/generate", json={"messages": "Hi, I am Ada.", "memory": memory}
        )
        assert first.json()["text"] == "Nice to meet you, Ada."
        second = await http.post(
            "/api/agents/assistant/generate", json={"messages": "Who am I?", "memory": memory}
        )
        assert second.status_code == 200, second.text
    assert second.json()["text"] == "Your **** name is Ada."
    # the guard's abort left nothing; the filter's rewrite is what was stored
    assert await _thread(service, "t-ada", "user-ada") == [
        ("user", "Hi, I am Ada."),
        ("assistant", "Nice to meet you, Ada."),
        ("user", "Who am I?"),
        ("assistant", "Your **** name is Ada."),
    ]
    thread = await _store(service).get_thread("t-ada", "user-ada")
    assert thread is not None
    assert thread.resource_id == "user-ada"


async def test_a_store_that_went_down_fails_the_http_run_saying_so_without_its_address(
    service: Service,
) -> None:
    await _store(service).close()  # the store goes away under a running service
    memory = {"thread": {"id": "t-down"}, "resource": "user-ada"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}", timeout=20) as http:
        response = await http.post(
            "/api/agents/assistant/generate", json={"messages": "hi", "memory": memory}
        )
        assert response.status_code == 200, response.text  # a failed run, not a failed request
        assert response.json()["finishReason"] == "error"
        said = "memory: loading thread 't-down' failed: the memory store is unavailable"
        assert response.json()["error"] == said
        chunks = await stream_chunks(http, "assistant", {"messages": "hi", "memory": memory})
    errors = [c for c in chunks if isinstance(c, dict) and c["type"] == "error"]
    assert [e["payload"]["message"] for e in errors] == [said]


async def test_grpc_calls_name_their_thread_and_resource(service: Service) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel:
        stub = agrpc.AgentServiceStub(channel)
        request = apb.GenerateRequest(agent_id="assistant", text="Hi.", thread_id="t-g", resource_id="u-g")
        first = await stub.Generate(request, timeout=20)
        stranger = apb.GenerateRequest(agent_id="assistant", text="Hi.", thread_id="t-g", resource_id="u-x")
        other = await stub.Generate(stranger, timeout=20)
    assert first.text == "Nice to meet you, Ada."
    # another resource using the thread id runs on a thread of its own, as on an unused id
    assert (other.error, other.finish_reason) == ("", "stop")
    assert await _thread(service, "t-g", "u-g") == [("user", "Hi."), ("assistant", "Nice to meet you, Ada.")]
    assert await _thread(service, "t-g", "u-x") == [("user", "Hi."), ("assistant", "Your **** name is Ada.")]


def test_the_body_names_the_thread_as_the_client_sends_it() -> None:
    shapes: list[dict[str, Any]] = [
        {"memory": {"thread": "t1", "resource": "u1"}},
        {"memory": {"thread": {"id": "t1", "title": "x"}, "resource": "u1", "options": {}}},
        {"threadId": "t1", "resourceId": "u1", "memory": {"thread": "t1", "resource": "u1"}},
    ]
    for shape in shapes:
        call = parse_body({"messages": "hi", **shape}, caller=ANONYMOUS, trust=TRUST, limits=LIMITS)
        assert (call.options.thread_id, call.options.resource_id) == ("t1", "u1"), shape
    # two different threads named: a 400, never one of them dropped
    both = {"threadId": "t1", "resourceId": "u1", "memory": {"thread": "other", "resource": "u1"}}
    with pytest.raises(BadRequestError, match=r"threadId and memory\.thread differ"):
        parse_body({"messages": "hi", **both}, caller=ANONYMOUS, trust=TRUST, limits=LIMITS)


def test_only_the_key_or_an_operator_names_the_resource() -> None:
    body = {"messages": "hi", "memory": {"thread": "t1", "resource": "u1"}}
    gateway = Caller("key-2", None, frozenset({"gateway"}))
    with pytest.raises(BadRequestError, match="threadId: a thread belongs to a resource"):
        parse_body(body, caller=gateway, trust=TRUST, limits=LIMITS)  # refused, never run without memory
    tenant = Caller("key-1", "u1", frozenset())
    bound = parse_body({"messages": "hi", "threadId": "t1"}, caller=tenant, trust=TRUST, limits=LIMITS)
    assert (bound.options.thread_id, bound.options.resource_id) == ("t1", "u1")
    other = Caller("key-3", "u2", frozenset())
    with pytest.raises(BadRequestError, match="bound to another resource"):
        parse_body(body, caller=other, trust=TRUST, limits=LIMITS)
    with pytest.raises(BadRequestError):
        parse_body({"messages": "hi", "memory": {"thread": 5}}, caller=ANONYMOUS, trust=TRUST, limits=LIMITS)
    for bad in ("t" * 257, "tab\there"):
        with pytest.raises(BadRequestError, match="threadId: must be a printable id"):
            parse_body(
                {"messages": "hi", "threadId": bad, "resourceId": "u1"},
                caller=ANONYMOUS,
                trust=TRUST,
                limits=LIMITS,
            )
