"""AgentService carries a run's warnings as the HTTP API does: GenerateResponse.warnings holds the
HTTP result's ``warnings`` (the call's own, then its model calls'), and a stream's last message the
same (its model calls' also ride in the ``step-start`` chunk, as over HTTP). Cases: a thread given
to an agent without memory, and a model setting the model's API lacks; plain and durable runs. A
fake OpenAI API on a real socket, the in-process service over real gRPC and HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from google.protobuf import json_format

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.providers.fakes import FakeOpenAI, error
from tests.integration.service.support import agent_stub

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

MEMORY_THREAD = "memory.thread"
TOP_K = {
    "type": "unsupported-setting",
    "setting": "topK",
    "details": "oa/gpt's API has no such setting: it was not sent",
}


@pytest.fixture(scope="module")
def openai() -> Iterator[FakeOpenAI]:
    api = FakeOpenAI()
    api.start()
    api.script("gpt", *[{"text": "Hi."}] * 16)
    api.script("bad", *[error(400, "no such thing")] * 4)
    yield api
    api.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(openai: FakeOpenAI, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    """Agent ``gpt`` (no memory) on the fake OpenAI API, ``durable``, its durable twin, and ``bad``,
    whose model refuses every call (a 400)."""
    db: Path = tmp_path_factory.mktemp("warnings") / "store.db"
    config = {
        "storage": {"backend": "sqlite", "path": str(db)},
        "providers": {"oa": {"kind": "openai", "baseUrl": openai.base_url}},
        "agents": {
            "gpt": {"model": "oa/gpt", "errorProcessorDefaults": False},
            "durable": {"model": "oa/gpt", "durable": True, "errorProcessorDefaults": False},
            "bad": {"model": "oa/bad", "errorProcessorDefaults": False},
        },
    }
    svc = Service(OrchestratorSettings(http_port=0, grpc_port=0), parse_config(config))
    async with svc:
        yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def stub(service: Service) -> AsyncIterator[agrpc.AgentServiceAsyncStub]:
    async with agent_stub(service) as s:
        yield s


async def _http_warnings(service: Service, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The HTTP generate result's ``warnings`` for `body` (agent ``gpt``)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{service.http_port}", timeout=20) as http:
        result = (await http.post("/api/agents/gpt/generate", json=body)).json()
    assert result["status"] == "success", result
    warnings: list[dict[str, Any]] = result["warnings"]
    return warnings


def _dicts(warnings: Any) -> list[dict[str, Any]]:
    return [json_format.MessageToDict(w) for w in warnings]


async def _stream_warned(stub: agrpc.AgentServiceAsyncStub, agent: str) -> list[apb.StreamResponse]:
    """Stream `agent` with a thread (it has no memory) and ``topK`` (OpenAI lacks it): the last
    message names ``memory.thread`` and ``topK``, as the result would, no other has warnings; the
    chunk messages."""
    settings = apb.ModelSettings(top_k=5)
    request = apb.StreamRequest(
        agent_id=agent, text="hi", thread_id="t1", resource_id="r1", model_settings=settings
    )
    *chunks, last = [reply async for reply in stub.Stream(request)]
    assert last.status == "success"
    assert not last.HasField("chunk")
    assert [w["setting"] for w in _dicts(last.warnings)] == [MEMORY_THREAD, "topK"]
    assert _dicts(last.warnings)[1] == TOP_K
    assert all(not r.warnings for r in chunks)
    return chunks


async def test_a_thread_given_to_an_agent_without_memory_is_a_warning_of_the_grpc_result(
    service: Service, stub: agrpc.AgentServiceAsyncStub
) -> None:
    request = apb.GenerateRequest(agent_id="gpt", text="hi", thread_id="t1", resource_id="r1")
    response = await stub.Generate(request)
    assert response.status == "success", response.error
    warnings = _dicts(response.warnings)
    assert MEMORY_THREAD in [w["setting"] for w in warnings]
    assert all(w["type"] == "unsupported-setting" and w["details"] for w in warnings)
    body = {"messages": "hi", "memory": {"thread": "t1", "resource": "r1"}}
    assert warnings == await _http_warnings(service, body)  # the HTTP result's, field for field


async def test_a_setting_the_models_api_lacks_is_a_warning_of_the_grpc_result(
    service: Service, stub: agrpc.AgentServiceAsyncStub
) -> None:
    settings = apb.ModelSettings(temperature=0.2, top_k=5)
    response = await stub.Generate(apb.GenerateRequest(agent_id="gpt", text="hi", model_settings=settings))
    assert response.status == "success", response.error
    assert _dicts(response.warnings) == [TOP_K]
    body = {"messages": "hi", "modelSettings": {"temperature": 0.2, "topK": 5}}
    assert _dicts(response.warnings) == await _http_warnings(service, body)


async def test_a_failed_runs_grpc_result_keeps_the_calls_warnings(stub: agrpc.AgentServiceAsyncStub) -> None:
    """A run that fails (its model refuses the call) still answers with the call's warnings, as a
    successful run does: the thread it was given was not kept either way."""
    request = apb.GenerateRequest(agent_id="bad", text="hi", thread_id="t1", resource_id="r1")
    response = await stub.Generate(request)
    assert (response.status, "no such thing" in response.error) == ("failed", True), response
    assert [w["setting"] for w in _dicts(response.warnings)] == [MEMORY_THREAD]


async def test_settings_the_api_has_give_no_grpc_warning(stub: agrpc.AgentServiceAsyncStub) -> None:
    settings = apb.ModelSettings(temperature=0.2)
    response = await stub.Generate(apb.GenerateRequest(agent_id="gpt", text="hi", model_settings=settings))
    assert response.status == "success", response.error
    assert list(response.warnings) == []


async def test_a_grpc_stream_gives_the_runs_warnings_last_and_the_models_at_its_step_start(
    stub: agrpc.AgentServiceAsyncStub,
) -> None:
    chunks = await _stream_warned(stub, "gpt")
    (start,) = [convert.chunk_from_proto(r.chunk) for r in chunks if r.chunk.type == "step-start"]
    assert start["payload"]["warnings"] == [TOP_K]


async def test_a_durable_runs_grpc_answers_carry_the_calls_warnings(
    stub: agrpc.AgentServiceAsyncStub,
) -> None:
    request = apb.GenerateRequest(
        agent_id="durable",
        text="hi",
        thread_id="t1",
        resource_id="r1",
        model_settings=apb.ModelSettings(top_k=5),
    )
    response = await stub.Generate(request)
    assert response.status == "success", response.error
    assert [w["setting"] for w in _dicts(response.warnings)] == [MEMORY_THREAD, "topK"]
    chunks = await _stream_warned(stub, "durable")
    assert all(r.HasField("offset") for r in chunks)
