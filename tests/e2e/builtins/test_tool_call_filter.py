"""tool-call-filter through a real `procmesh-sidecar tool-call-filter` process and the agent loop."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config.agents import AgentMemoryConfig
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.sidecar_process import SidecarProcess
from procmesh_orchestrator.store import StorageConfig
from tests.e2e.builtins.harness import call, make_config, ref, run, start

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


def user(text: str, msg_id: str) -> dict[str, Any]:
    return {"id": msg_id, "role": "user", "content": {"format": 2, "parts": [{"type": "text", "text": text}]}}


def tool_turn(call_id: str, name: str, args: Any, result: Any, text: str = "") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts.append(
        {
            "type": "tool-invocation",
            "toolInvocation": {
                "state": "result",
                "toolCallId": call_id,
                "toolName": name,
                "args": args,
                "result": result,
            },
        }
    )
    return {"id": f"m-{call_id}", "role": "assistant", "content": {"format": 2, "parts": parts}}


HISTORY = [
    user("weather and sum?", "u1"),
    tool_turn("c1", "weather", {"city": "NYC"}, {"type": "text", "value": "Sunny, 72F"}),
    tool_turn("c2", "calculator", {"expr": "2+2"}, "4", text="Let me add."),
    user("thanks, and now?", "u2"),
]


def tool_ids(prompt: list[dict[str, Any]]) -> list[str]:
    return [
        p["toolCallId"]
        for m in prompt
        if isinstance(m["content"], list)
        for p in m["content"]
        if p.get("type") in ("tool-call", "tool-result")
    ]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "tool-call-filter")


async def test_default_removes_every_history_call_and_result(address: str) -> None:
    out = await run(make_config(address, input_processors=[ref("tool-call-filter")]), HISTORY)
    prompt = out.requests[0].prompt
    assert tool_ids(prompt) == []
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]  # emptied messages dropped
    assert prompt[2]["content"] == [{"type": "text", "text": "Let me add."}]


async def test_exclude_filters_only_named_tools_as_pairs(address: str) -> None:
    out = await run(
        make_config(address, input_processors=[ref("tool-call-filter", exclude=["weather"])]), HISTORY
    )
    assert tool_ids(out.requests[0].prompt) == ["c2", "c2"]


async def test_empty_exclude_is_a_no_op(address: str) -> None:
    plain = await run(make_config(address), HISTORY)
    filtered = await run(
        make_config(address, input_processors=[ref("tool-call-filter", exclude=[])]), HISTORY
    )
    assert filtered.requests[0].prompt == plain.requests[0].prompt


async def test_preserve_model_output_keeps_a_compact_result_never_args(address: str) -> None:
    cfg = make_config(address, input_processors=[ref("tool-call-filter", preserve_model_output=True)])
    out = await run(cfg, HISTORY)
    prompt = out.requests[0].prompt
    texts = [p["text"] for m in prompt if isinstance(m["content"], list) for p in m["content"] if "text" in p]
    assert "weather result:\nSunny, 72F" in texts  # explicit model output {"type": "text", "value"} kept
    assert not any("NYC" in t for t in texts)  # never the raw arguments
    assert not any("calculator result" in t for t in texts)  # a raw result has no model output


TOOLS = {"lookup": {"description": "Look something up.", "result": {"found": True}}}
LOOP: list[dict[str, Any]] = [
    {"toolCalls": [{"name": "lookup", "args": {"q": "a"}}]},
    {"toolCalls": [{"name": "lookup", "args": {"q": "b"}}]},
    {"text": "done"},
]


async def test_this_runs_tool_calls_are_preserved_by_default(address: str) -> None:
    cfg = make_config(address, input_processors=[ref("tool-call-filter")], responses=LOOP, tools=TOOLS)
    out = await run(cfg, HISTORY)
    assert out.result.text == "done"
    assert tool_ids(out.requests[2].prompt) == ["call_1", "call_1", "call_2", "call_2"]
    # stored history untouched: the response messages keep every tool invocation
    invocations = [
        p["toolInvocation"]["toolCallId"]
        for m in out.result.response_messages
        for p in m["content"]["parts"]
        if p["type"] == "tool-invocation"
    ]
    assert invocations == ["call_1", "call_2"]


@pytest.mark.parametrize(("keep", "expected"), [(0, []), (1, ["call_2", "call_2"])])
async def test_filter_after_tool_steps(address: str, keep: int, expected: list[str]) -> None:
    cfg = make_config(
        address,
        input_processors=[ref("tool-call-filter", filter_after_tool_steps=keep)],
        responses=LOOP,
        tools=TOOLS,
    )
    out = await run(cfg, "go")
    assert tool_ids(out.requests[2].prompt) == expected


async def test_with_memory_the_prompt_is_filtered_and_the_stored_history_is_not(
    address: str, tmp_path: Path
) -> None:
    responses: list[dict[str, Any]] = [LOOP[0], {"text": "first answer"}, {"text": "second answer"}]
    cfg = make_config(address, input_processors=[ref("tool-call-filter")], responses=responses, tools=TOOLS)
    agent = cfg.agents["a"].model_copy(update={"memory": AgentMemoryConfig(last_messages=20)})
    cfg = cfg.model_copy(
        update={"agents": {"a": agent}, "storage": StorageConfig(path=str(tmp_path / "memory.db"))}
    )
    on_thread = CallOptions(thread_id="t1", resource_id="alice")
    async with App(cfg) as app:
        first = await call(app, "look a up", options=on_thread)
        assert first.result.text == "first answer"
        second = await call(app, "and now?", options=on_thread)
        assert app.store is not None
        stored = await app.store.messages("t1", "alice")
    # The second turn's prompt holds the loaded history, minus its tool call and result ...
    prompt = second.requests[0].prompt
    assert "look a up" in json.dumps(prompt)
    assert tool_ids(prompt) == []
    # ... while the store keeps the first turn whole: the call with its result.
    invocations = [
        (p["toolInvocation"]["toolName"], p["toolInvocation"]["state"])
        for m in stored
        for p in m["content"]["parts"]
        if p["type"] == "tool-invocation"
    ]
    assert invocations == [("lookup", "result")]
    assert stored[0]["role"] == "user"
