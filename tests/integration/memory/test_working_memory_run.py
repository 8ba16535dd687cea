"""Working memory in the run (issue 29 item 1, item 3's per-call options), on a real SQLite store:
the instruction and data in the prompt, the ``updateWorkingMemory`` tool offered and run, its
scopes, schema-mode merges, and what a read-only call does not do."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.errors import InvalidMemoryInputError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.framework.memory import AgentMemory, MemoryCallOptions
from procmesh_orchestrator.run.framework.working_memory import (
    DEFAULT_TEMPLATE,
    TOOL_NAME,
    WorkingMemorySettings,
    instruction,
)
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.run.tools import StaticTool
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.unit.orchestrator.run.fakes import agent

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "pets": {"type": "array"},
        "city": {"type": ["string", "null"]},
    },
}


class Scripted:
    """A model that answers each call with the next scripted step: text, or tool calls with args."""

    model_id = "scripted"

    def __init__(self, *steps: dict[str, Any]) -> None:
        self.steps = list(steps)
        self.requests: list[ModelRequest] = []

    async def stream(self, request: ModelRequest) -> AsyncIterator[dict[str, Any]]:
        self.requests.append(request)
        step = self.steps.pop(0) if self.steps else {"text": "ok"}
        if "text" in step:
            yield {"type": "text-delta", "payload": {"id": "t0", "text": step["text"]}}
        calls = step.get("calls", [])
        for i, (name, args) in enumerate(calls):
            call_id = f"c{len(self.requests)}-{i}"
            yield {"type": "tool-call", "payload": {"toolCallId": call_id, "toolName": name, "args": args}}
        usage = {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}
        yield {
            "type": "finish",
            "payload": {"finishReason": "tool-calls" if calls else "stop", "usage": usage},
        }


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteMemoryStore]:
    opened = SqliteMemoryStore(tmp_path / "memory.db")
    await opened.start()
    yield opened
    await opened.close()


def bot(model: Scripted, store: SqliteMemoryStore, settings: WorkingMemorySettings, **kw: Any) -> Any:
    return agent(model, [], memory=AgentMemory(store, 10, "sqlite:test", settings, **kw))  # type: ignore[arg-type]


def systems(request: ModelRequest) -> list[str]:
    return [
        m["content"] if isinstance(m["content"], str) else "" for m in request.prompt if m["role"] == "system"
    ]


def on(thread: str, **memory: Any) -> CallOptions:
    return CallOptions(thread_id=thread, resource_id="ada", memory=MemoryCallOptions(**memory))


def update(memory: Any) -> dict[str, Any]:
    return {"calls": [(TOOL_NAME, {"memory": memory})]}


async def test_an_update_in_one_thread_is_in_the_next_threads_prompt(store: SqliteMemoryStore) -> None:
    settings = WorkingMemorySettings()
    model = Scripted(
        update("# User Information\n- **First Name**: Ada"), {"text": "Noted."}, {"text": "Hi Ada"}
    )
    assistant = bot(model, store, settings)
    first = await assistant.generate("I am Ada", on("t1"))
    assert first.text == "Noted."
    # the first prompt: the reference's instruction with no data yet, and the tool on offer
    assert systems(model.requests[0]) == [instruction(settings, None, read_only=False)]
    assert "<working_memory_data>\nnull\n</working_memory_data>" in systems(model.requests[0])[0]
    offered = {t["name"]: t for t in model.requests[0].tools}
    assert offered[TOOL_NAME]["inputSchema"]["properties"]["memory"]["type"] == "string"
    await assistant.generate("Who am I?", on("t2"))
    assert systems(model.requests[2]) == [
        instruction(settings, "# User Information\n- **First Name**: Ada", read_only=False)
    ]
    # the thread keeps the conversation, never the working-memory call
    stored = await store.messages("t1", "ada")
    assert [message_text(m) for m in stored] == ["I am Ada", "Noted."]
    assert TOOL_NAME not in json.dumps(stored)


async def test_thread_scope_keeps_one_memory_per_thread(store: SqliteMemoryStore) -> None:
    model = Scripted(update("t1 notes"), {"text": "ok"}, {"text": "ok"})
    assistant = bot(model, store, WorkingMemorySettings(scope="thread"))
    await assistant.generate("hello", on("t1"))
    await assistant.generate("hello", on("t2"))
    assert "<working_memory_data>\nnull\n" in systems(model.requests[2])[0]
    assert (await store.get_working_memory("ada", "t1")).text == "t1 notes"  # type: ignore[union-attr]
    assert await store.get_working_memory("ada") is None


async def test_schema_mode_merges_and_null_deletes(store: SqliteMemoryStore) -> None:
    settings = WorkingMemorySettings(schema=SCHEMA)
    model = Scripted(
        update({"name": "Ada", "city": "London"}),
        {"calls": [(TOOL_NAME, {"memory": {"pets": ["Rex"]}}), (TOOL_NAME, {"memory": {"city": None}})]},
        {"text": "ok"},
    )
    await bot(model, store, settings).generate("I am Ada from London with a dog Rex", on("t1"))
    stored = await store.get_working_memory("ada")
    assert stored is not None
    assert json.loads(stored.text) == {"name": "Ada", "pets": ["Rex"]}
    tool = {t["name"]: t for t in model.requests[0].tools}[TOOL_NAME]
    assert tool["inputSchema"]["properties"]["memory"] == SCHEMA
    assert (
        "When working with json data, the object format below represents the template:\n"
        '{"name":"","pets":[],"city":null}' in systems(model.requests[0])[0]
    )


async def test_a_bare_template_never_replaces_stored_markdown(store: SqliteMemoryStore) -> None:
    model = Scripted(update("- Name: Ada"), update(DEFAULT_TEMPLATE), {"text": "ok"})
    await bot(model, store, WorkingMemorySettings()).generate("hi", on("t1"))
    assert (await store.get_working_memory("ada")).text == "- Name: Ada"  # type: ignore[union-attr]
    answers = [p for m in model.requests[2].prompt if m["role"] == "tool" for p in m["content"]]
    assert "Update skipped to prevent data loss." in json.dumps(answers)


async def test_a_read_only_call_reads_but_writes_nothing(store: SqliteMemoryStore) -> None:
    await store.update_working_memory("ada", "", lambda old: "- Name: Ada")
    settings = WorkingMemorySettings()
    model = Scripted({"text": "Hi Ada"}, {"text": "again"})
    assistant = bot(model, store, settings)
    await assistant.generate("Who am I?", on("t1", read_only=True))
    assert systems(model.requests[0]) == [instruction(settings, "- Name: Ada", read_only=True)]
    assert model.requests[0].tools == []
    assert await store.messages("t1", "ada") == []
    # the agent's own readOnly does the same; a call may not lift it... but may narrow the window
    await bot(model, store, settings, read_only=True).generate("x", on("t1"))
    assert await store.messages("t1", "ada") == []


async def test_a_call_narrows_the_history_window(store: SqliteMemoryStore) -> None:
    model = Scripted({"text": "one"}, {"text": "two"}, {"text": "three"})
    assistant = bot(model, store, WorkingMemorySettings())
    await assistant.generate("q1", on("t1"))
    await assistant.generate("q2", on("t1", last_messages=0))
    assert [m["role"] for m in model.requests[1].prompt] == ["system", "user"]
    await assistant.generate("q3", on("t1", last_messages=2))
    assert len([m for m in model.requests[2].prompt if m["role"] != "system"]) == 3


def test_the_instruction_is_the_references_word_for_word() -> None:
    """The texts @mastra/core 1.71's WorkingMemory processor made for these inputs (the default
    template with no data, a custom template with data, a JSON Schema with data, read-only)."""
    ref = json.loads(
        (Path(__file__).parents[2] / "fixtures" / "working_memory_instructions.json").read_text()
    )
    assert instruction(WorkingMemorySettings(), None, read_only=False) == ref["markdown"]
    custom = WorkingMemorySettings(template="# Custom\n- a:")
    assert instruction(custom, "# Custom\n- a: 1", read_only=False) == ref["markdownData"]
    assert instruction(WorkingMemorySettings(schema=SCHEMA), '{"name":"Ada"}', read_only=False) == ref["json"]
    assert instruction(WorkingMemorySettings(), None, read_only=True) == ref["readOnly"]


async def test_the_python_api_reads_and_replaces_it(store: SqliteMemoryStore) -> None:
    model = Scripted({"text": "ok"})
    assistant = bot(model, store, WorkingMemorySettings())
    assert await assistant.get_working_memory("ada") is None
    await assistant.update_working_memory("ada", "- Name: Ada")
    assert await assistant.get_working_memory("ada") == "- Name: Ada"
    await assistant.generate("hi", on("t1"))
    assert "<working_memory_data>\n- Name: Ada\n" in systems(model.requests[0])[0]
    per_thread = bot(model, store, WorkingMemorySettings(scope="thread", schema=SCHEMA))
    with pytest.raises(InvalidMemoryInputError, match="threadId: required"):
        await per_thread.get_working_memory("ada")
    with pytest.raises(InvalidMemoryInputError, match="is JSON"):
        await per_thread.update_working_memory("ada", "not json", thread_id="t1")
    without = agent(model, [], memory=AgentMemory(store, 10, "sqlite:test"))  # type: ignore[arg-type]
    with pytest.raises(InvalidMemoryInputError, match="has no working memory"):
        await without.get_working_memory("ada")


async def test_a_read_only_call_stays_read_only_when_resumed_after_approval(store: SqliteMemoryStore) -> None:
    pay = StaticTool("pay", "Pays.", {"type": "object"}, {"ok": True}, requires_approval=True)
    model = Scripted({"calls": [("pay", {})]}, {"text": "paid"})

    async def the_store() -> SqliteMemoryStore:
        return store

    def replica() -> Any:
        memory = AgentMemory(store, 10, "sqlite:test", WorkingMemorySettings())
        return agent(model, [], memory=memory, tools={"pay": pay}, store=the_store)  # type: ignore[arg-type]

    suspended = await replica().generate("pay it", on("t1", read_only=True))
    assert suspended.status == "suspended"
    done = await replica().approve_tool_call(suspended.run_id, suspended.suspended[0]["toolCallId"])
    assert done.text == "paid"
    assert "READ-ONLY" in systems(model.requests[-1])[0]
    assert await store.messages("t1", "ada") == []  # neither the suspension nor the resumed run saved
