"""The run on the real stores (SQLite and PostgreSQL): turns saved whole, failures that say what failed
(the store's address only in the log), threads scoped by resource.

The processors here are fakes (the sidecar tiers are test_memory_run_service.py and
test_memory_run_scenarios.py); what is real is the store: its transactions, its limits, its errors.
"""

from __future__ import annotations

import asyncio

import pytest

from procmesh_orchestrator.errors import MemoryStoreError, StoreUnavailableError
from procmesh_orchestrator.run import Agent, CallOptions
from procmesh_orchestrator.run.framework.memory import AgentMemory
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.store import MemoryStore
from tests.integration.memory.conftest import Backend
from tests.unit.orchestrator.run.fakes import FakeModel, agent

pytestmark = pytest.mark.e2e


def remembering(store: MemoryStore, *responses: dict[str, str]) -> Agent:
    return agent(FakeModel(*responses), [], memory=AgentMemory(store, 10, str(getattr(store, "name", ""))))


def texts(request: ModelRequest) -> list[str]:
    """The text of each message of a model request's prompt."""
    out = []
    for m in request.prompt:
        content = m["content"]
        out.append(content if isinstance(content, str) else "".join(p.get("text", "") for p in content))
    return out


def on(thread: str, resource: str = "u1") -> CallOptions:
    return CallOptions(thread_id=thread, resource_id=resource)


async def test_concurrent_conversations_each_keep_their_turns_in_order(store: MemoryStore) -> None:
    turns = 5
    bot = agent(
        FakeModel(*({"text": f"a{i}"} for i in range(turns * 4))), [], memory=AgentMemory(store, 100, "store")
    )

    async def talk(thread: str) -> None:
        for i in range(turns):
            await bot.generate(f"{thread}-q{i}", on(thread))

    await asyncio.gather(*(talk(f"t{n}") for n in range(4)))
    for n in range(4):
        stored = await store.messages(f"t{n}", "u1")
        questions = [message_text(m) for m in stored if m["role"] == "user"]
        assert questions == [f"t{n}-q{i}" for i in range(turns)]
        assert [m["role"] for m in stored] == ["user", "assistant"] * turns


async def test_an_oversized_turn_fails_the_run_saying_why_and_nothing_of_it_is_saved(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    store = backend.open(max_message_bytes=2_000)
    await store.start()
    try:
        bot = remembering(store, {"text": "short"}, {"text": "word " * 1_000})
        await bot.generate("first", on("t1"))
        with pytest.raises(MemoryStoreError) as failed:
            await bot.generate("second", on("t1"))
        error = str(failed.value)
        assert error.startswith("memory: saving a turn to thread 't1' failed: thread 't1': message 1 is ")
        assert error.endswith("bytes as JSON, more than the 2000 allowed")
        assert backend.name + ":" not in error  # no store address for the client ...
        assert f"memory store {backend.name}:" in caplog.text  # ... the log has it
        assert [message_text(m) for m in await store.messages("t1", "u1")] == ["first", "short "]
    finally:
        await store.close()


async def test_a_streamed_turn_too_large_to_save_ends_with_an_error_chunk_naming_why(
    backend: Backend,
) -> None:
    # as generate raises: the stream must not end in a bare `finish` with the turn silently lost
    store = backend.open(max_message_bytes=2_000)
    await store.start()
    try:
        handle = remembering(store, {"text": "word " * 1_000}).stream("hi", on("t1"))
        chunks = [c async for c in handle]
        result = await handle.result()
        errors = [c for c in chunks if c["type"] == "error"]
        assert len(errors) == 1, chunks
        assert "more than the 2000 allowed" in errors[0]["payload"]["message"]
        assert [c["type"] for c in chunks][-2:] == ["error", "finish"]
        assert chunks[-1]["payload"]["finishReason"] == "error"
        assert (result.status, result.finish_reason) == ("failed", "error")
        assert await store.messages("t1", "u1") == []
    finally:
        await store.close()


async def test_a_store_that_is_down_fails_the_run_before_the_model_is_called(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    store = backend.open()
    await store.start()
    await store.close()
    model = FakeModel({"text": "never"})
    bot = agent(model, [], memory=AgentMemory(store, 10, str(getattr(store, "name", ""))))
    with pytest.raises(StoreUnavailableError) as failed:
        await bot.generate("hi", on("t1"))
    assert str(failed.value) == "memory: loading thread 't1' failed: the memory store is unavailable"
    assert f"memory store {backend.name}:" in caplog.text
    assert model.requests == []


async def test_another_resource_using_the_thread_id_gets_its_own_thread(store: MemoryStore) -> None:
    model = FakeModel({"text": "mine"}, {"text": "yours"}, {"text": "mine again"})
    bot = agent(model, [], memory=AgentMemory(store, 10, str(getattr(store, "name", ""))))
    await bot.generate("private", on("t1", "alice"))
    answer = await bot.generate("let me see", on("t1", "mallory"))  # as on an unknown id
    assert answer.text == "yours "
    assert texts(model.requests[1]) == ["let me see"]
    await bot.generate("and now?", on("t1", "alice"))  # alice's runs on t1 go on, hers alone
    assert texts(model.requests[2]) == ["private", "mine ", "and now?"]
    assert [message_text(m) for m in await store.messages("t1", "alice")] == [
        "private",
        "mine ",
        "and now?",
        "mine again ",
    ]
    assert [message_text(m) for m in await store.messages("t1", "mallory")] == ["let me see", "yours "]
