"""An in-process `FunctionTool` (the Python API's callable tool): it suspends itself for the
caller's input and is resumed with data by a second Agent on the same store (SEED-GAPS P6), and
its lifecycle hooks come in the reference's order around each execution (P7)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.errors import ResumeMismatchError
from procmesh_orchestrator.run.function_tool import FunctionTool, FunctionToolContext
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.unit.orchestrator.run.fakes import Call, FakeModel, agent


def weather_tool(events: list[Any]) -> FunctionTool:
    async def weather(args: Any, context: FunctionToolContext) -> Any:
        events.append(["execute", context.resumed])
        if not context.resumed:
            return await context.suspend({"question": "Which unit?"}, resume_schema={"type": "object"})
        return {"unit": context.resume_data["unit"], "asked": context.suspend_payload}

    async def start(context: FunctionToolContext) -> None:
        events.append(["on_input_start", context.tool_call_id])

    async def available(args: Any, context: FunctionToolContext) -> None:
        events.append(["on_input_available", args])
        raise RuntimeError("a hook that raises fails nothing")

    async def output(result: Any, context: FunctionToolContext) -> None:
        events.append(["on_output", result])

    return FunctionTool(
        "weather",
        "asks for the unit",
        weather,
        on_input_start=start,
        on_input_available=available,
        on_output=output,
    )


async def test_a_function_tool_suspends_resumes_with_data_and_calls_its_hooks_in_order(
    tmp_path: Path,
) -> None:
    store = SqliteMemoryStore(tmp_path / "runs.db")
    await store.start()

    async def opened() -> SqliteMemoryStore:
        return store

    events: list[Any] = []
    log: list[Call] = []
    try:
        first = agent(
            FakeModel({"tool_calls": ["weather"]}), log, tools={"weather": weather_tool(events)}, store=opened
        )
        stream = first.stream("go")
        async with asyncio.timeout(10):
            chunks = [c async for c in stream]
        suspended = await stream.result()
        (asked,) = [c["payload"] for c in chunks if c["type"] == "tool-call-suspended"]
        assert asked["suspendPayload"] == {"question": "Which unit?"}
        assert suspended.status == "suspended"
        assert events == [["on_input_start", "c0"], ["on_input_available", {}], ["execute", False]]

        second = agent(
            FakeModel({"text": "done"}), log, tools={"weather": weather_tool(events)}, store=opened
        )
        with pytest.raises(ResumeMismatchError, match="awaits resume data, not an approval"):
            await second.approve_tool_call(suspended.run_id, "c0")
        resumed = await second.resume_generate(suspended.run_id, "c0", {"unit": "celsius"})
        assert resumed.status == "success", resumed.error
        result = {"unit": "celsius", "asked": {"question": "Which unit?"}}
        assert [r["result"] for r in resumed.steps[0]["toolResults"]] == [result]
        assert events[3:] == [
            ["on_input_start", "c0"],
            ["on_input_available", {}],
            ["execute", True],
            ["on_output", result],
        ]
    finally:
        await store.close()
