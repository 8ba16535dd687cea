"""What a response cache needs from the loop: processOutputResult at a clean run's end only, and a
cached step's tool calls replayed with their recorded results instead of run again."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator.run.hooks import (
    LLMRequestResult,
    LLMResponseResult,
    MessagesResult,
    ToolResultResult,
)
from procmesh_orchestrator.run.tools import StaticTool, ToolCall, ToolOutcome
from tests.unit.orchestrator.run.fakes import Call, FakeModel, FakeProcessor, abort, agent, reply


def waiter(name: str = "cache") -> FakeProcessor:
    """Asks, in processLLMResponse, to see the run's final result."""
    return FakeProcessor(
        name,
        {
            "process_llm_response": lambda args, info: reply(LLMResponseResult(output_result_if_clean=True)),
            "process_output_result": lambda args, info: reply(MessagesResult()),
        },
    )


def observer(name: str, **answers: Any) -> FakeProcessor:
    return FakeProcessor(
        name, {"process_output_result": lambda args, info: reply(MessagesResult()), **answers}
    )


def result_calls(log: list[Call]) -> list[str]:
    return [c.processor for c in log if c.args.hook == "process_output_result"]


async def test_it_comes_last_whatever_its_lane() -> None:
    log: list[Call] = []
    cache = waiter()
    lane = (observer("first"), cache, observer("last"))
    result = await agent(FakeModel({"text": "ok"}), log, input=(cache,), output=lane).generate("hi")

    assert result.tripwire is None
    assert result_calls(log) == ["first", "last", "cache"]  # its place in the output lane is skipped
    [final] = [c for c in log if c.processor == "cache" and c.args.hook == "process_output_result"]
    assert final.args.finish_reason == "stop"
    assert final.args.steps[0]["text"] == "ok "


async def test_it_is_not_called_when_a_process_output_result_aborts() -> None:
    log: list[Call] = []
    blocker = FakeProcessor(
        "blocker",
        {"process_output_result": lambda args, info: reply(MessagesResult(), abort=abort("blocker", "no"))},
    )
    result = await agent(FakeModel({"text": "ok"}), log, input=(waiter(),), output=(blocker,)).generate("hi")

    assert result.tripwire is not None
    assert result_calls(log) == ["blocker"]


async def test_it_is_not_called_when_a_step_is_rejected() -> None:
    log: list[Call] = []
    judge = FakeProcessor(
        "judge",
        {"process_output_step": lambda args, info: reply(MessagesResult(), abort=abort("judge", "no"))},
    )
    result = await agent(FakeModel({"text": "ok"}), log, input=(waiter(),), output=(judge,)).generate("hi")

    assert result.tripwire is not None
    assert result_calls(log) == []


async def test_it_is_not_called_when_the_run_fails() -> None:
    log: list[Call] = []
    model = FakeModel({"tool_calls": ["weather"]}, {"error": "provider down"})
    weather = StaticTool("weather", "", {"type": "object"}, "sunny")
    stream = agent(model, log, input=(waiter(),), output=(observer("seen"),), tools={"weather": weather})
    handle = stream.stream("hi")
    chunks = [c async for c in handle]
    result = await handle.result()

    assert result.finish_reason == "error"
    assert chunks[-1]["type"] == "finish"
    assert result_calls(log) == ["seen"]  # the lane still sees the failed run; the cache does not


async def test_without_asking_it_keeps_its_place() -> None:
    log: list[Call] = []
    quiet = observer("quiet", process_llm_response=lambda args, info: reply(LLMResponseResult()))
    lane = (quiet, observer("last"))
    await agent(FakeModel({"text": "ok"}), log, input=(quiet,), output=lane).generate("hi")

    assert result_calls(log) == ["quiet", "last"]


CACHED_STEP = [
    {"type": "tool-call", "payload": {"toolCallId": "c0", "toolName": "weather", "args": {}}},
    {"type": "finish", "payload": {"finishReason": "tool-calls", "usage": {}}},
]
RECORDED = [{"toolCallId": "c0", "toolName": "weather", "args": {}, "result": "sunny, 21C"}]


class CountingTool(StaticTool):
    runs: list[Any]

    async def execute(self, run: Any, call: ToolCall, writer: Any) -> ToolOutcome:
        self.runs.append(call.args)
        return await super().execute(run, call, writer)


def counting_tool() -> CountingTool:
    tool = CountingTool("weather", "", {"type": "object"}, "rainy")
    object.__setattr__(tool, "runs", [])
    return tool


def hit_at_step_zero(recorded: list[dict[str, Any]]) -> FakeProcessor:
    def answer(args: Any, info: Any) -> Any:
        if info.step_number == 0:
            return reply(LLMRequestResult(cached_response=CACHED_STEP, cached_tool_results=recorded))
        return reply(LLMRequestResult())

    return FakeProcessor("cache", {"process_llm_request": answer})


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_cached_step_replays_its_recorded_tool_results(streamed: bool) -> None:
    log: list[Call] = []
    model = FakeModel({"text": "sunny it is"})
    tool = counting_tool()
    rewrite = FakeProcessor(
        "rewrite",
        {"process_tool_result": lambda args, info: reply(ToolResultResult(True, f"{args.result}!"))},
    )
    spec = agent(model, log, input=(hit_at_step_zero(RECORDED),), output=(rewrite,), tools={"weather": tool})
    chunks: list[dict[str, Any]] = []
    if streamed:
        handle = spec.stream("weather?")
        chunks = [c async for c in handle]
        result = await handle.result()
    else:
        result = await spec.generate("weather?")

    assert tool.runs == []  # the tool did not run again
    assert "process_tool_result" not in [c.args.hook for c in log]  # the recorded value is final
    assert result.steps[0]["toolResults"] == RECORDED
    tool_turn = next(p for p in model.requests[0].prompt if p["role"] == "tool")
    assert tool_turn["content"][0]["output"] == "sunny, 21C"
    assert len(model.requests) == 1  # step 0 was the cache's
    if streamed:
        [chunk] = [c for c in chunks if c["type"] == "tool-result"]
        assert chunk["payload"] == RECORDED[0]


async def test_a_cached_call_without_a_recorded_result_runs_as_usual() -> None:
    log: list[Call] = []
    tool = counting_tool()
    spec = agent(FakeModel({"text": "ok"}), log, input=(hit_at_step_zero([]),), tools={"weather": tool})
    result = await spec.generate("weather?")

    assert tool.runs == [{}]
    assert result.steps[0]["toolResults"][0]["result"] == "rainy"
