"""Working memory and a call's memory options over gRPC (issue 29 items 1 and 3), against a real
`procmesh-orchestrator` process with a scripted model behind a fake OpenAI server that records
each prompt: GetWorkingMemory and UpdateWorkingMemory for the caller's resource, Generate's
``memory_options``, and the refusals as status codes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.run.framework.working_memory import TOOL_NAME
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.providers.fakes import FakeOpenAI

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

ADA = [("authorization", "Bearer key-ada")]
BOB = [("authorization", "Bearer key-bob")]
TEMPLATE = "# User\n- Name:"


@pytest.fixture(scope="module")
def model() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    fake.start()
    fake.script("keeper", {"text": "Hi Ada."}, {"text": "Still Ada."})
    yield fake
    fake.stop()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stub(
    model: FakeOpenAI,
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[agrpc.AgentServiceStub]:
    memory = {"lastMessages": 10, "workingMemory": {"template": TEMPLATE}}
    config = {
        "storage": {"backend": "sqlite", "dataDir": str(tmp_path_factory.mktemp("memory"))},
        "providers": {"fake": {"kind": "openai", "baseUrl": model.base_url}},
        "models": {"demo": {"provider": "demo"}},
        "agents": {
            "keeper": {"model": "fake/keeper", "errorProcessorDefaults": False, "memory": memory},
            "notes": {
                "model": "demo",
                "memory": {"workingMemory": {"scope": "thread", "schema": {"type": "object"}}},
            },
            "plain": {"model": "demo"},
        },
    }
    env = {"PROCMESH_API_KEYS": "key-ada=user-ada,key-bob=user-bob"}
    orchestrator = await asyncio.to_thread(start_orchestrator, config, env=env)
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        yield agrpc.AgentServiceStub(channel)


async def refused(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value.code(), str(error.value.details())


async def test_a_resource_s_working_memory_is_read_and_written_over_grpc(
    stub: agrpc.AgentServiceStub, model: FakeOpenAI
) -> None:
    empty = await stub.GetWorkingMemory(apb.GetWorkingMemoryRequest(agent_id="keeper"), metadata=ADA)
    assert not empty.HasField("working_memory")
    assert (empty.source, empty.format, empty.template) == ("resource", "markdown", TEMPLATE)
    update = apb.UpdateWorkingMemoryRequest(agent_id="keeper", working_memory="# User\n- Name: Ada")
    await stub.UpdateWorkingMemory(update, metadata=ADA)
    got = await stub.GetWorkingMemory(apb.GetWorkingMemoryRequest(agent_id="keeper"), metadata=ADA)
    assert got.working_memory == "# User\n- Name: Ada"
    # another tenant's resource has its own (none), and may not name Ada's
    bobs = await stub.GetWorkingMemory(apb.GetWorkingMemoryRequest(agent_id="keeper"), metadata=BOB)
    assert not bobs.HasField("working_memory")
    other = apb.GetWorkingMemoryRequest(agent_id="keeper", resource_id="user-ada")
    assert (await refused(stub.GetWorkingMemory(other, metadata=BOB)))[0] == grpc.StatusCode.NOT_FOUND

    # a run of the resource reads it; a read-only call gets no tool and saves nothing
    run = apb.GenerateRequest(agent_id="keeper", text="Who am I?", thread_id="t1")
    assert (await stub.Generate(run, metadata=ADA)).text == "Hi Ada."
    read_only = apb.GenerateRequest(
        agent_id="keeper",
        text="And now?",
        thread_id="t1",
        memory_options=apb.MemoryOptions(read_only=True, last_messages=0),
    )
    assert (await stub.Generate(read_only, metadata=ADA)).text == "Still Ada."
    first, second = (r.body for r in model.calls("keeper"))
    system = "\n".join(str(m["content"]) for m in first["messages"] if m["role"] == "system")
    assert "<working_memory_data>\n# User\n- Name: Ada\n</working_memory_data>" in system
    assert [t["function"]["name"] for t in first["tools"]] == [TOOL_NAME]
    assert "READ-ONLY" in str(second["messages"][0]["content"])
    assert not second.get("tools")
    assert [m["role"] for m in second["messages"]] == ["system", "user"]  # last_messages 0: no history


async def test_the_refusals_are_status_codes(stub: agrpc.AgentServiceStub) -> None:
    thread_scoped = apb.GetWorkingMemoryRequest(agent_id="notes")
    code, details = await refused(stub.GetWorkingMemory(thread_scoped, metadata=ADA))
    assert (code, "threadId: required" in details) == (grpc.StatusCode.INVALID_ARGUMENT, True)
    # a thread-scoped text goes to a thread of the caller's resource, never to one not there
    typo = apb.UpdateWorkingMemoryRequest(agent_id="notes", thread_id="t1-typo", working_memory='{"a": 0}')
    code, details = await refused(stub.UpdateWorkingMemory(typo, metadata=ADA))
    assert (code, "no thread 't1-typo'" in details) == (grpc.StatusCode.NOT_FOUND, True)
    await stub.Generate(apb.GenerateRequest(agent_id="notes", text="hi", thread_id="t1"), metadata=ADA)
    bobs = apb.UpdateWorkingMemoryRequest(agent_id="notes", thread_id="t1", working_memory='{"b": 1}')
    assert (await refused(stub.UpdateWorkingMemory(bobs, metadata=BOB)))[0] == grpc.StatusCode.NOT_FOUND
    not_json = apb.UpdateWorkingMemoryRequest(agent_id="notes", thread_id="t1", working_memory="{oops")
    code, details = await refused(stub.UpdateWorkingMemory(not_json, metadata=ADA))
    assert (code, "is JSON" in details) == (grpc.StatusCode.INVALID_ARGUMENT, True)
    ok = apb.UpdateWorkingMemoryRequest(agent_id="notes", thread_id="t1", working_memory='{"a": 1}')
    await stub.UpdateWorkingMemory(ok, metadata=ADA)
    got = await stub.GetWorkingMemory(
        apb.GetWorkingMemoryRequest(agent_id="notes", thread_id="t1"), metadata=ADA
    )
    assert (got.working_memory, got.source, got.format, got.template) == ('{"a": 1}', "thread", "json", "{}")
    code, _ = await refused(
        stub.GetWorkingMemory(apb.GetWorkingMemoryRequest(agent_id="plain"), metadata=ADA)
    )
    assert code == grpc.StatusCode.NOT_FOUND
    code, _ = await refused(stub.GetWorkingMemory(apb.GetWorkingMemoryRequest(agent_id="keeper")))
    assert code == grpc.StatusCode.UNAUTHENTICATED
