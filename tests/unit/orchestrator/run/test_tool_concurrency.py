"""The tool calls of one step run concurrently up to the agent's bound, kept in the model's order."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import ExecuteToolResult, ToolResultResult
from procmesh_orchestrator.run.tools import ProcessorTool, ToolCall, ToolOutcome, Writer
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.unit.orchestrator.run.fakes import Call, FakeModel, FakeProcessor, agent, reply


@dataclass
class Meeting:
    """What the fake tools saw: the events in order, and one started-event per tool."""

    events: list[str] = field(default_factory=list)
    started: dict[str, asyncio.Event] = field(default_factory=dict)


@dataclass
class MeetTool:
    """Starts, waits until `waits_for` has started (if any), finishes: with a partner it can only
    finish when both are in flight at once."""

    name: str
    meeting: Meeting
    waits_for: str | None = None
    description: str = "meets"
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    requires_approval: bool = False

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> ToolOutcome:
        self.meeting.events.append(f"start {self.name}")
        self.meeting.started.setdefault(self.name, asyncio.Event()).set()
        if self.waits_for is not None:
            await self.meeting.started.setdefault(self.waits_for, asyncio.Event()).wait()
        await writer({"type": "data-progress", "data": self.name})
        self.meeting.events.append(f"end {self.name}")
        return ToolOutcome(result=self.name)


def recorder(meeting: Meeting) -> FakeProcessor:
    def seen(args: Any, info: Any) -> Any:
        meeting.events.append(f"processToolResult {args.tool_name}")
        return reply(ToolResultResult())

    return FakeProcessor("seen", {"process_tool_result": seen})


async def test_two_calls_are_in_flight_at_once_and_come_out_in_the_models_order() -> None:
    meeting = Meeting()
    # "a" cannot end before "b" started: one at a time, this run would never end
    tools = {"a": MeetTool("a", meeting, waits_for="b"), "b": MeetTool("b", meeting)}
    model = FakeModel({"tool_calls": ["a", "b"]}, {"text": "met"})
    log: list[Call] = []
    stream = agent(model, log, output=(recorder(meeting),), tools=tools, tool_call_concurrency=2).stream("go")
    async with asyncio.timeout(10):  # a failure, not a hang, if the calls were run one by one
        chunks = [c async for c in stream]
    result = await stream.result()

    assert meeting.events.index("start b") < meeting.events.index("end a")
    assert meeting.events.index("end b") < meeting.events.index("end a")  # b finished first
    seen = [e for e in meeting.events if e.startswith("processToolResult")]
    assert seen == ["processToolResult a", "processToolResult b"]
    tool_chunks = [
        (c["type"], c.get("data") or c["payload"]["toolName"])
        for c in chunks
        if "tool" in c["type"] or c["type"] == "data-progress"
    ]
    assert tool_chunks[-4:] == [
        ("data-progress", "a"),
        ("tool-result", "a"),
        ("data-progress", "b"),
        ("tool-result", "b"),
    ]
    assert [r["toolName"] for r in result.steps[0]["toolResults"]] == ["a", "b"]


async def test_a_bound_of_one_runs_each_call_after_the_previous_ones_process_tool_result() -> None:
    meeting = Meeting()
    tools = {"a": MeetTool("a", meeting), "b": MeetTool("b", meeting)}
    model = FakeModel({"tool_calls": ["a", "b"]}, {"text": "done"})
    log: list[Call] = []
    await agent(model, log, output=(recorder(meeting),), tools=tools, tool_call_concurrency=1).generate("go")

    assert meeting.events == [
        "start a",
        "end a",
        "processToolResult a",
        "start b",
        "end b",
        "processToolResult b",
    ]


async def test_the_calls_before_one_awaiting_approval_run_together_and_the_run_suspends(
    tmp_path: Path,
) -> None:
    meeting = Meeting()
    tools = {
        "a": MeetTool("a", meeting, waits_for="b"),
        "b": MeetTool("b", meeting),
        "gated": MeetTool("gated", meeting, requires_approval=True),
    }
    model = FakeModel({"tool_calls": ["a", "b", "gated"]}, {"text": "never"})
    log: list[Call] = []
    store = SqliteMemoryStore(tmp_path / "runs.db")
    await store.start()

    async def opened() -> SqliteMemoryStore:
        return store

    try:
        suspending = agent(model, log, tools=tools, store=opened)
        stream = suspending.stream("go")
        async with asyncio.timeout(10):
            chunks = [c async for c in stream]
        suspended = await stream.result()
        assert suspended.status == "suspended"
        assert "start gated" not in meeting.events
        order = [c["type"] for c in chunks if c["type"] in ("tool-result", "tool-call-approval")]
        assert order == ["tool-result", "tool-result", "tool-call-approval"]

        done = await suspending.approve_tool_call(suspended.run_id, "c2")
    finally:
        await store.close()
    assert done.status == "success", done.error
    assert meeting.events.count("start a") == 1  # the calls that ran are not run again
    assert [r["toolName"] for r in done.steps[0]["toolResults"]] == ["a", "b", "gated"]


async def test_a_sidecar_tools_effects_reach_the_run_at_its_turn_not_when_it_finished() -> None:
    meeting = Meeting()

    def hosted(args: Any, info: Any) -> Any:  # the sidecar's answer; "a" waits until it came
        meeting.started.setdefault("b", asyncio.Event()).set()
        return reply(ExecuteToolResult("hosted"), custom_chunks=[{"type": "data-note", "data": "b"}])

    host = FakeProcessor("host", {"execute_tool": hosted})
    b = ProcessorTool("b", "hosted", {"type": "object"}, host)
    tools = {"a": MeetTool("a", meeting, waits_for="b"), "b": b}
    model = FakeModel({"tool_calls": ["a", "b"]}, {"text": "done"})
    log: list[Call] = []
    stream = agent(model, log, tools=tools, tool_call_concurrency=2).stream("go")
    async with asyncio.timeout(10):
        chunks = [c async for c in stream]

    # b answered while a still waited; its custom chunk still comes after a's result
    kinds = [c["type"] for c in chunks if c["type"] in ("tool-result", "data-note")]
    assert kinds == ["tool-result", "data-note", "tool-result"]
