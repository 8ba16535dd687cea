"""Request-context values hooks set (`run.context`): later hooks and tools see them, reserved keys
and keys the agent's schema refuses fail the call under its policy, a snapshot keeps them apart
from the caller's context, and a resumed run goes on with them (fakes for processors and model,
a real SQLite store for the suspended run)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from procmesh_orchestrator.errors import ProcessorFailedError, RequestContextError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import CallOptions, context, snapshot
from procmesh_orchestrator.run.hooks import HookArgs, InputArgs, InputResult, InputStepResult, Reply, RunInfo
from procmesh_orchestrator.run.loop import Run
from procmesh_orchestrator.run.tools import ClientTool, StaticTool, ToolCall, ToolOutcome
from procmesh_orchestrator.store.sqlite import SqliteMemoryStore
from tests.unit.orchestrator.run import test_run_control as run_control
from tests.unit.orchestrator.run.fakes import Call, FakeModel, FakeProcessor, agent, reply


def setter(values: dict[str, Any]) -> Any:
    """processInput that sets `values` (and changes nothing else)."""
    return lambda args, info: reply(InputResult(), context=dict(values))


def seen(into: list[dict[str, Any]], result: Any) -> Any:
    """A hook that records the request context it is called with."""

    def answer(args: HookArgs[Any], info: RunInfo) -> Reply[Any]:
        into.append(dict(info.request_context))
        return reply(result)

    return answer


class ContextTool(StaticTool):
    """A tool that records the run's request context when it runs."""

    contexts: list[dict[str, Any]]

    async def execute(self, run: Any, call: ToolCall, writer: Any) -> ToolOutcome:
        self.contexts.append(dict(run.info.request_context))
        return await super().execute(run, call, writer)


def context_tool(name: str, *, approval: bool = False) -> ContextTool:
    made = ContextTool(name, f"the {name} tool", {"type": "object"}, "done", None, approval)
    object.__setattr__(made, "contexts", [])
    return made


class OnlyTier:
    """A requestContextSchema that declares `tenant` and `tier` (a string) only."""

    def check(self, ctx: Mapping[str, Any], where: str = "requestContext") -> None:
        undeclared = sorted(set(ctx) - {"tenant", "tier"})
        if undeclared:
            raise RequestContextError(f"{where}: {undeclared} not declared", keys=undeclared)
        if not isinstance(ctx.get("tier", ""), str):
            raise RequestContextError(f"{where}.tier: not a string", keys=["tier"])


async def test_later_hooks_and_tools_see_a_value_processinput_set() -> None:
    later: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    tagger = FakeProcessor("tagger", {"process_input": setter({"tier": "gold"})})
    reader = FakeProcessor(
        "reader",
        {"process_input": seen(later, InputResult()), "process_input_step": seen(steps, InputStepResult())},
    )
    lookup = context_tool("lookup")
    model = FakeModel({"tool_calls": ["lookup"]}, {"text": "done"})
    caller_context = {"tenant": "t1"}
    result = await agent(model, [], input=(tagger, reader), tools={"lookup": lookup}).generate(
        "hi", CallOptions(request_context=caller_context)
    )
    assert result.status == "success"
    assert later == [{"tenant": "t1", "tier": "gold"}]
    assert steps == [{"tenant": "t1", "tier": "gold"}] * 2  # both steps
    assert lookup.contexts == [{"tenant": "t1", "tier": "gold"}]
    assert caller_context == {"tenant": "t1"}  # the caller's dict is not changed


async def test_a_later_value_of_a_key_replaces_the_earlier_one() -> None:
    later: list[dict[str, Any]] = []
    first = FakeProcessor("first", {"process_input": setter({"tier": "silver", "a": 1})})
    second = FakeProcessor("second", {"process_input": setter({"tier": "gold"})})
    reader = FakeProcessor("reader", {"process_input": seen(later, InputResult())})
    await agent(FakeModel({"text": "ok"}), [], input=(first, second, reader)).generate("hi")
    assert later == [{"tier": "gold", "a": 1}]


@pytest.mark.parametrize("key", sorted(context.RESERVED_KEYS))
async def test_a_reserved_key_fails_a_fail_closed_processor(key: str) -> None:
    bad = FakeProcessor("bad", {"process_input": setter({key: "someone-else"})})
    with pytest.raises(ProcessorFailedError) as failed:
        await agent(FakeModel({"text": "ok"}), [], input=(bad,)).generate(
            "hi", CallOptions(thread_id="t", resource_id="r")
        )
    error = failed.value
    assert (error.processor_id, error.hook) == ("bad", "process_input")
    assert repr(key) in error.cause
    assert "reserved" in error.cause


async def test_a_reserved_key_from_a_fail_open_processor_drops_its_answer_and_the_run_goes_on() -> None:
    later: list[dict[str, Any]] = []
    bad = FakeProcessor(
        "bad", {"process_input": setter({"resourceId": "x", "tier": "gold"})}, fail_closed=False
    )
    reader = FakeProcessor("reader", {"process_input": seen(later, InputResult())})
    result = await agent(FakeModel({"text": "ok"}), [], input=(bad, reader)).generate("hi")
    assert result.status == "success"
    assert later == [{}]  # nothing of the refused answer applied, its other key included


async def test_the_agents_schema_refuses_a_key_it_does_not_declare_or_a_bad_value() -> None:
    def checked(values: dict[str, Any]) -> str | None:
        info = RunInfo("run", "a", {"tenant": "t1"}, context_check=OnlyTier())
        return context.accept(info, values)

    assert checked({"tier": "gold"}) is None
    undeclared = checked({"plan": "pro"})
    assert undeclared is not None
    assert "'plan'" in undeclared
    assert "agent refuses" in undeclared
    assert checked({"tier": 3}) is not None
    info = RunInfo("run", "a", {"tenant": "t1"}, context_check=OnlyTier())
    assert context.accept(info, {"tier": 3}) is not None
    assert info.request_context == {"tenant": "t1"}
    assert info.hook_values == {}


async def test_a_run_applies_the_agents_schema_to_a_hooks_values() -> None:
    later: list[dict[str, Any]] = []
    fine = FakeProcessor("fine", {"process_input": setter({"tier": "gold"})})
    reader = FakeProcessor("reader", {"process_input": seen(later, InputResult())})
    run_agent = agent(FakeModel({"text": "ok"}), [], input=(fine, reader), context_schema=OnlyTier())
    assert (await run_agent.generate("hi")).status == "success"
    assert later == [{"tier": "gold"}]

    stray = FakeProcessor("stray", {"process_input": setter({"plan": "pro"})})
    with pytest.raises(ProcessorFailedError, match="'plan'") as failed:
        await agent(FakeModel({"text": "ok"}), [], input=(stray,), context_schema=OnlyTier()).generate("hi")
    assert failed.value.processor_id == "stray"


async def test_a_client_tools_call_chunk_carries_the_context() -> None:
    tagger = FakeProcessor("tagger", {"process_input": setter({"tier": "gold"})})
    model = FakeModel({"text": "asking", "tool_calls": ["confirm"]})
    options = CallOptions(request_context={"tenant": "t1"}, client_tools=[ClientTool("confirm", "ask")])
    stream = agent(model, [], input=(tagger,)).stream("hi", options)
    calls = [c async for c in stream if c["type"] == "tool-call"]
    assert [c["payload"]["requestContext"] for c in calls] == [{"tenant": "t1", "tier": "gold"}]
    result = await stream.result()
    assert result.finish_reason == "tool-calls"
    assert "requestContext" not in json.dumps(result.steps)  # the chunk's copy only


async def test_a_snapshot_keeps_hook_values_apart_and_a_resumed_run_goes_on_with_them() -> None:
    tagger = FakeProcessor("tagger", {"process_input": setter({"tier": "gold"})})
    spec = agent(FakeModel({"text": "ok"}), [], input=(tagger,)).spec
    run = Run(
        spec, "hi", CallOptions(request_context={"tenant": "t1"}), sink=None, metrics=OrchestratorMetrics()
    )
    await run.call(tagger, InputArgs([], [], []))
    data = json.loads(json.dumps(snapshot.capture(run, next_step=1)))
    assert data["requestContext"] == {"tenant": "t1"}  # what the lanes were chosen from
    assert data["hookValues"] == {"tier": "gold"}

    resumed = Run.resume(spec, data, None, CallOptions(), sink=None, metrics=OrchestratorMetrics())
    assert resumed.info.request_context == {"tenant": "t1", "tier": "gold"}
    assert resumed.options.request_context == {"tenant": "t1"}
    again = json.loads(json.dumps(snapshot.capture(resumed, next_step=2)))
    assert again["hookValues"] == {"tier": "gold"}  # kept for the next snapshot too


store = run_control.store  # the fixture: a real SQLite store


async def test_a_run_suspended_for_approval_resumes_with_the_values(store: SqliteMemoryStore) -> None:
    log: list[Call] = []
    tagger = FakeProcessor("tagger", {"process_input": setter({"tier": "gold"})})
    pay = context_tool("pay", approval=True)
    model = FakeModel({"tool_calls": ["pay"]}, {"text": "paid"})
    spec: dict[str, Any] = {"input": (tagger,), "tools": {"pay": pay}, "store": run_control.opener(store)}
    suspended = await agent(model, log, **spec).generate("pay", CallOptions(request_context={"tenant": "t1"}))
    assert suspended.status == "suspended"

    # another replica resumes it; the resuming caller's own value of a key a hook set does not win
    resumer = CallOptions(request_context={"tenant": "t1", "tier": "bronze"})
    done = await agent(model, log, **spec).approve_tool_call(suspended.run_id, "c0", resumer)
    assert done.status == "success"
    assert pay.contexts == [{"tenant": "t1", "tier": "gold"}]
    assert [c.processor for c in log] == ["tagger"]  # processInput did not run again
