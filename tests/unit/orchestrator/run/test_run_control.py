"""The loop's run control: stopWhen, the abort signal, tool approval (suspend and resume on a
real SQLite store), client tools and argument validation (fakes for processors and model)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from procmesh import tracing
from procmesh_orchestrator.errors import ResumeConflictError, SuspendedRunNotFoundError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.hooks import Chunk
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.run.stop import HasToolCall, StepCountIs
from procmesh_orchestrator.run.tool_calls import DECLINED
from procmesh_orchestrator.run.tools import ClientTool, StaticTool, ToolCall, ToolOutcome
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.unit.orchestrator.run.fakes import Call, FakeModel, FakeProcessor, agent, reply


class CountingTool(StaticTool):
    calls: list[Any]

    async def execute(self, run: Any, call: ToolCall, writer: Any) -> ToolOutcome:
        self.calls.append(call.args)
        return await super().execute(run, call, writer)


def tool(name: str, result: Any = "done", *, approval: bool = False, schema: Any = None) -> CountingTool:
    made = CountingTool(name, f"the {name} tool", schema or {"type": "object"}, result, None, approval)
    object.__setattr__(made, "calls", [])
    return made


def looping_model(n: int = 10) -> FakeModel:
    return FakeModel(*[{"text": f"step{i}", "tool_calls": ["work"]} for i in range(n)])


@pytest.fixture
async def store(tmp_path: Path) -> AsyncGenerator[SqliteMemoryStore, None]:
    opened = SqliteMemoryStore(tmp_path / "runs.db")
    await opened.start()
    yield opened
    await opened.close()


def opener(store: SqliteMemoryStore) -> Any:
    async def open_it() -> SqliteMemoryStore:
        return store

    return open_it


# -- stopWhen ---------------------------------------------------------------------------------------


async def test_step_count_stops_the_loop_after_the_tool_work() -> None:
    work = tool("work")
    run_agent = agent(looping_model(), [], tools={"work": work}, stop_when=(StepCountIs(2),))
    result = await run_agent.generate("go")
    assert len(result.steps) == 2
    assert len(work.calls) == 2  # the last step's tools ran before the loop stopped
    assert result.finish_reason == "tool-calls"


async def test_has_tool_call_stops_after_the_step_that_called_it() -> None:
    model = FakeModel({"tool_calls": ["work"]}, {"tool_calls": ["final"]}, {"text": "never"})
    tools = {"work": tool("work"), "final": tool("final")}
    result = await agent(model, [], tools=tools, stop_when=(HasToolCall("final"),)).generate("go")
    assert [s["toolCalls"][0]["toolName"] for s in result.steps] == ["work", "final"]
    assert len(model.requests) == 2


async def test_a_callable_per_call_replaces_the_agents_conditions() -> None:
    seen: list[int] = []

    def after_three(steps: list[dict[str, Any]]) -> bool:
        seen.append(len(steps))
        return len(steps) >= 3

    run_agent = agent(looping_model(), [], tools={"work": tool("work")}, stop_when=(StepCountIs(1),))
    result = await run_agent.generate("go", CallOptions(stop_when=[after_three]))
    assert len(result.steps) == 3
    assert seen == [1, 2, 3]


async def test_max_steps_still_caps_the_loop() -> None:
    result = await agent(looping_model(), [], tools={"work": tool("work")}, max_steps=2).generate("go")
    assert len(result.steps) == 2


# -- abort ------------------------------------------------------------------------------------------


class StallingModel:
    """Streams two deltas, then waits until cancelled (records that it was)."""

    model_id = "stalling"

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.streaming = asyncio.Event()

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        yield {"type": "text-delta", "payload": {"id": "t", "text": "partial "}}
        yield {"type": "text-delta", "payload": {"id": "t", "text": "answer"}}
        self.streaming.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        yield {"type": "finish", "payload": {"finishReason": "stop", "usage": {}}}  # never reached


async def test_cancel_keeps_the_partial_text_and_cancels_the_model_call() -> None:
    model = StallingModel()
    stream = agent(model, []).stream("go")  # type: ignore[arg-type]
    received: list[Chunk] = []

    async def read() -> None:
        async for chunk in stream:
            received.append(chunk)

    reader = asyncio.create_task(read())
    await asyncio.wait_for(model.streaming.wait(), 5)
    result = await asyncio.wait_for(stream.cancel(), 5)
    await asyncio.wait_for(reader, 5)

    assert model.cancelled.is_set()
    assert result.status == "aborted"
    assert result.text == "partial answer"
    assert received[-1] == {"type": "abort", "payload": {}}
    streamed = "".join(c["payload"]["text"] for c in received if c["type"] == "text-delta")
    assert streamed == result.text


async def test_an_abort_signal_already_set_runs_nothing() -> None:
    model = FakeModel({"text": "hello"})
    signal = asyncio.Event()
    signal.set()
    result = await agent(model, []).generate("go", CallOptions(abort_signal=signal))
    assert result.status == "aborted"
    assert model.requests == []


# -- argument validation ----------------------------------------------------------------------------


async def test_invalid_args_are_a_tool_error_the_model_sees_and_the_tool_never_runs() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    weather = tool("weather", schema=schema)
    model = FakeModel({"tool_calls": ["weather"]}, {"text": "sorry"})
    stream = agent(model, [], tools={"weather": weather}).stream("weather?")
    chunks = [c async for c in stream]
    await stream.result()

    [error] = [c for c in chunks if c["type"] == "tool-error"]
    assert error["payload"]["error"].startswith("Tool input validation failed for weather.")
    assert "'city' is a required property" in error["payload"]["error"]
    assert weather.calls == []
    tool_turn = next(p for p in model.requests[1].prompt if p["role"] == "tool")
    assert "'city' is a required property" in tool_turn["content"][0]["output"]


# -- approval -----------------------------------------------------------------------------------


async def test_a_call_needing_approval_suspends_and_resumes_elsewhere(store: SqliteMemoryStore) -> None:
    counted: list[Call] = []
    counter = FakeProcessor("counter", {"process_input": lambda args, info: reply(None)})
    model = FakeModel({"text": "let me", "tool_calls": ["pay"]}, {"text": "paid"})
    pay = tool("pay", {"ok": True}, approval=True)
    first = agent(model, counted, input=(counter,), tools={"pay": pay}, store=opener(store))
    stream = first.stream("pay the bill", CallOptions(request_context={"tenant": "t1"}))
    chunks = [c async for c in stream]
    suspended = await stream.result()

    assert suspended.status == "suspended"
    assert [c["type"] for c in chunks][-2:] == ["tool-call-approval", "finish"]
    assert chunks[-2]["payload"]["toolName"] == "pay"
    assert suspended.suspended == [{"toolCallId": "c0", "toolName": "pay", "args": {}}]
    assert pay.calls == []
    inputs_before = len(counted)

    # another Agent on the same store (another replica): the model and tools are its own
    second = agent(model, counted, input=(counter,), tools={"pay": pay}, store=opener(store))
    done = await second.approve_tool_call(suspended.run_id, "c0")
    assert done.status == "success"
    assert done.run_id == suspended.run_id
    assert pay.calls == [{}]
    assert done.steps[0]["toolResults"][0]["result"] == {"ok": True}
    assert done.text.endswith("paid ")
    assert len(counted) == inputs_before  # processInput did not run again
    assert model.requests[-1].prompt[-1]["role"] == "tool"

    with pytest.raises(ResumeConflictError, match="already resumed"):
        await second.approve_tool_call(suspended.run_id, "c0")


async def test_a_second_decision_while_suspended_is_a_conflict(store: SqliteMemoryStore) -> None:
    model = FakeModel({"tool_calls": ["pay"]}, {"text": "ok"})
    spec: dict[str, Any] = {"tools": {"pay": tool("pay", approval=True)}, "store": opener(store)}
    suspended = await agent(model, [], **spec).generate("pay")
    record = await store.claim_suspended(suspended.run_id, "c0")  # someone else is resuming it
    assert record.run_id == suspended.run_id
    with pytest.raises(ResumeConflictError):
        await agent(model, [], **spec).approve_tool_call(suspended.run_id, "c0")


async def test_decline_tells_the_model_and_the_tool_never_runs(store: SqliteMemoryStore) -> None:
    pay = tool("pay", approval=True)
    model = FakeModel({"tool_calls": ["pay"]}, {"text": "understood"})
    suspended = await agent(model, [], tools={"pay": pay}, store=opener(store)).generate("pay")
    done = await agent(model, [], tools={"pay": pay}, store=opener(store)).decline_tool_call(
        suspended.run_id, "c0"
    )
    assert pay.calls == []
    assert done.steps[0]["toolResults"][0]["result"] == DECLINED
    tool_turn = next(p for p in model.requests[-1].prompt if p["role"] == "tool")
    assert tool_turn["content"][0]["output"] == DECLINED


async def test_per_call_approval_overrides_the_tool(store: SqliteMemoryStore) -> None:
    model = FakeModel({"tool_calls": ["pay"]}, {"text": "ok"})
    run_agent = agent(model, [], tools={"pay": tool("pay")}, store=opener(store))
    result = await run_agent.generate("pay", CallOptions(require_tool_approval=True))
    assert result.status == "suspended"


async def test_a_resumed_step_suspends_again_at_its_next_call_awaiting_approval(
    store: SqliteMemoryStore,
) -> None:
    pay, ship = tool("pay", approval=True), tool("ship", approval=True)
    model = FakeModel({"tool_calls": ["pay", "ship"]}, {"text": "done"})

    def make() -> Any:
        return agent(model, [], tools={"pay": pay, "ship": ship}, store=opener(store))

    first = await make().generate("pay and ship")
    assert first.suspended == [{"toolCallId": "c0", "toolName": "pay", "args": {}}]
    second = await make().approve_tool_call(first.run_id, "c0")
    assert second.status == "suspended"
    assert second.suspended == [{"toolCallId": "c1", "toolName": "ship", "args": {}}]
    assert (pay.calls, ship.calls) == ([{}], [])
    done = await make().approve_tool_call(first.run_id, "c1")
    assert done.status == "success"
    assert (pay.calls, ship.calls) == ([{}], [{}])
    assert [r["toolName"] for r in done.steps[0]["toolResults"]] == ["pay", "ship"]
    assert len(model.requests) == 2  # the suspended step's model call is never made again


async def test_a_suspended_step_is_not_an_error_in_the_trace(
    store: SqliteMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("test"))
    model = FakeModel({"tool_calls": ["pay"]})
    result = await agent(model, [], tools={"pay": tool("pay", approval=True)}, store=opener(store)).generate(
        "pay"
    )
    assert result.status == "suspended"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["step 0"].status.status_code == StatusCode.UNSET
    assert spans["invoke_agent a"].status.status_code == StatusCode.UNSET


async def test_approval_without_a_store_fails_clearly() -> None:
    model = FakeModel({"tool_calls": ["pay"]})
    stream = agent(model, [], tools={"pay": tool("pay", approval=True)}).stream("pay")
    chunks = [c async for c in stream]
    result = await stream.result()
    assert result.status == "failed"
    assert "no store" in (result.error or "")
    assert chunks[-1]["type"] == "error"


async def test_an_unknown_run_is_not_found(store: SqliteMemoryStore) -> None:
    with pytest.raises(SuspendedRunNotFoundError):
        await agent(FakeModel(), [], store=opener(store)).approve_tool_call("no-such-run", "c0")


# -- client tools -----------------------------------------------------------------------------------


async def test_a_client_tool_ends_the_run_and_its_result_continues_the_conversation() -> None:
    model = FakeModel({"text": "asking", "tool_calls": ["locate"]}, {"text": "you are home"})
    locate = ClientTool("locate", "where the user is", {"type": "object"})
    run_agent = agent(model, [])
    first = await run_agent.generate("where am I?", CallOptions(client_tools=[locate]))
    assert first.finish_reason == "tool-calls"
    [assistant] = first.response_messages
    assert assistant["content"]["parts"][-1]["toolInvocation"]["state"] == "call"

    # the client ran it and sends the conversation back with the result (no thread: all of it)
    result_message = {
        "role": "tool",
        "content": {
            "format": 2,
            "parts": [{"type": "tool-result", "toolCallId": "c0", "toolName": "locate", "result": "home"}],
        },
    }
    history = [{"role": "user", "content": "where am I?"}, assistant, result_message]
    second = await run_agent.generate(history, CallOptions(client_tools=[locate]))
    assert second.text == "you are home "
    tool_turn = next(p for p in model.requests[-1].prompt if p["role"] == "tool")
    assert tool_turn["content"][0]["output"] == "home"


async def test_a_resumed_run_keeps_the_calls_step_settings(store: SqliteMemoryStore) -> None:
    model = FakeModel({"tool_calls": ["pay"]}, {"text": "ok"})
    spec: dict[str, Any] = {"tools": {"pay": tool("pay", approval=True)}, "store": opener(store)}
    options = CallOptions(model_settings={"temperature": 0.1}, tool_choice="required")
    suspended = await agent(model, [], **spec).generate("pay", options)
    await agent(model, [], **spec).approve_tool_call(suspended.run_id, "c0")
    first, resumed = model.requests
    assert resumed.model_settings == first.model_settings == {"temperature": 0.1}
    assert resumed.tool_choice == first.tool_choice == "required"


async def test_a_suspension_the_store_cannot_keep_fails_without_naming_the_store(tmp_path: Path) -> None:
    down = SqliteMemoryStore(str(tmp_path / "kept.db"))
    await down.start()
    await down.close()  # the store is gone when the run suspends
    model = FakeModel({"tool_calls": ["pay"]})
    stream = agent(model, [], tools={"pay": tool("pay", approval=True)}, store=opener(down)).stream("pay")
    chunks = [c async for c in stream]
    result = await stream.result()
    assert result.status == "failed"
    assert (result.error or "").startswith("suspending the run failed: ")
    for text in (result.error or "", chunks[-1]["payload"]["message"]):
        assert "kept.db" not in text
        assert str(tmp_path) not in text
