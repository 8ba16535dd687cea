"""The run loop against a fake hook caller and a fake model: no sockets, no gRPC, no protobuf."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.hooks import (
    APIErrorResult,
    InputResult,
    LLMResponseResult,
    MessagesResult,
    StreamEffects,
    ToolResultResult,
    Violation,
)
from procmesh_orchestrator.run.messages import message_text, signal_record
from procmesh_orchestrator.run.tools import StaticTool
from tests.unit.orchestrator.run.fakes import Call, FakeModel, FakeProcessor, abort, agent, reply


def hooks_called(log: list[Call]) -> list[tuple[str, str]]:
    return [(c.processor, c.args.hook) for c in log]


async def test_an_input_abort_is_a_tripwire_and_the_model_is_never_called() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "never"})
    guard = FakeProcessor(
        "guard", {"process_input": lambda args, info: reply(InputResult(), abort=abort("guard", "no"))}
    )
    result = await agent(model, log, input=(guard,)).generate("hello")

    assert result.tripwire == {"processorId": "guard", "reason": "no", "retry": False, "metadata": None}
    assert result.finish_reason == "other"
    assert model.requests == []
    assert result.violations == [{"processorId": "guard", "message": "no", "detail": None}]


async def test_input_messages_a_processor_returns_are_what_the_model_sees() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "ok"})

    def redact(args: Any, info: Any) -> Any:
        [msg] = args.messages
        msg["content"]["parts"][0]["text"] = "[redacted]"
        return reply(InputResult(messages=[msg]))

    await agent(model, log, input=(FakeProcessor("pii", {"process_input": redact}),)).generate("secret")

    assert model.requests[0].prompt == [{"role": "user", "content": [{"type": "text", "text": "[redacted]"}]}]


async def test_an_output_step_retry_feeds_back_until_the_budget_is_spent() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "bad one"}, {"text": "bad two"}, {"text": "bad three"}, {"text": "unused"})
    judge = FakeProcessor(
        "judge",
        {
            "process_output_step": lambda args, info: reply(
                MessagesResult(), abort=abort("judge", f"too rude: {args.text.strip()}", retry=True)
            )
        },
    )
    result = await agent(model, log, output=(judge,), max_processor_retries=2).generate("hi")

    assert len(model.requests) == 3  # the first try and two retries; the budget is then spent
    assert [c.retry_count for c in log] == [0, 1, 2]
    assert result.tripwire is not None
    assert result.tripwire["reason"] == "too rude: bad three"
    # each retry's prompt carries the previous reason as a <system-reminder> after the conversation
    last_prompt = model.requests[2].prompt
    feedback = [p["content"][0]["text"] for p in last_prompt if p["role"] == "user"][1:]
    assert feedback == [
        "<system-reminder>too rude: bad one</system-reminder>",
        "<system-reminder>too rude: bad two</system-reminder>",
    ]


async def test_a_retry_without_a_budget_is_an_abort() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "bad"}, {"text": "good"})
    judge = FakeProcessor(
        "judge",
        {
            "process_output_step": lambda args, info: reply(
                MessagesResult(), abort=abort("judge", "x", retry=True)
            )
        },
    )
    result = await agent(model, log, output=(judge,)).generate("hi")

    assert len(model.requests) == 1
    assert result.tripwire is not None


async def test_the_tool_loop_runs_the_tool_and_its_result_through_process_tool_result() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "checking", "tool_calls": ["weather"]}, {"text": "sunny it is"})
    rewrite = FakeProcessor(
        "rewrite",
        {"process_tool_result": lambda args, info: reply(ToolResultResult(True, f"{args.result}, 21C"))},
    )
    weather = StaticTool("weather", "the weather", {"type": "object"}, "sunny")
    result = await agent(model, log, output=(rewrite,), tools={"weather": weather}).generate("weather?")

    assert [c.step_number for c in log] == [1]  # processToolResult sees the step after the call
    assert result.steps[0]["toolResults"][0]["result"] == "sunny, 21C"
    tool_turn = next(p for p in model.requests[1].prompt if p["role"] == "tool")
    assert tool_turn["content"][0]["output"] == "sunny, 21C"
    assert result.text == "checking sunny it is "
    assert len(result.steps) == 2


async def test_a_tool_nobody_has_is_an_error_result_not_a_failure() -> None:
    log: list[Call] = []
    model = FakeModel({"tool_calls": ["missing"]}, {"text": "sorry"})
    stream = agent(model, log).stream("go")
    chunks = [c async for c in stream]
    result = await stream.result()

    [error] = [c for c in chunks if c["type"] == "tool-error"]
    assert "not available" in error["payload"]["error"]
    assert result.finish_reason == "stop"


async def test_api_error_retries_stop_at_the_cap() -> None:
    log: list[Call] = []
    model = FakeModel(*[{"error": "overloaded"}] * 10)
    retrier = FakeProcessor(
        "retrier", {"process_api_error": lambda args, info: reply(APIErrorResult(retry=True))}
    )
    with pytest.raises(APICallError, match="overloaded") as caught:
        await agent(model, log, error=(retrier,)).generate("hi")

    assert len(model.requests) == 4  # the first call and the implicit cap of 3 retries
    assert [c.args.status for c in log] == [500] * 4
    assert caught.value.result.finish_reason == "error"


async def test_api_error_retry_succeeds_when_the_model_recovers() -> None:
    log: list[Call] = []
    model = FakeModel({"error": "overloaded"}, {"text": "fine now"})
    retrier = FakeProcessor(
        "retrier", {"process_api_error": lambda args, info: reply(APIErrorResult(retry=True))}
    )
    result = await agent(model, log, error=(retrier,), max_processor_retries=1).generate("hi")

    assert result.text == "fine now "
    assert [s["finishReason"] for s in result.steps] == ["error", "stop"]


async def test_stream_parts_can_be_dropped_and_rewritten() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "hello darn world"})

    def censor(chunk: dict[str, Any]) -> list[Any] | None:
        if chunk["type"] != "text-delta":
            return None
        text = chunk["payload"]["text"]
        if text == "darn ":
            return []  # dropped
        return [{**chunk, "payload": {**chunk["payload"], "text": text.upper()}}]

    stream = agent(model, log, output=(FakeProcessor("censor", stream_answer=censor),)).stream("hi")
    chunks = [c async for c in stream]
    result = await stream.result()

    assert [c["payload"]["text"] for c in chunks if c["type"] == "text-delta"] == ["HELLO ", "WORLD "]
    assert result.text == "HELLO WORLD "
    assert next(c["type"] for c in chunks) == "start"
    assert chunks[-1]["type"] == "finish"


async def test_a_stream_abort_ends_the_stream_with_a_tripwire() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "one two three"})

    def stop_at_two(chunk: dict[str, Any]) -> list[Any] | None:
        if chunk["type"] == "text-delta" and chunk["payload"]["text"] == "two ":
            return [abort("stopper", "saw two", hook="process_output_stream")]
        return None

    stream = agent(model, log, output=(FakeProcessor("stopper", stream_answer=stop_at_two),)).stream("hi")
    chunks = [c async for c in stream]
    result = await stream.result()

    assert [c["payload"]["text"] for c in chunks if c["type"] == "text-delta"] == ["one "]
    assert chunks[-1] == {
        "type": "tripwire",
        "payload": {"processorId": "stopper", "reason": "saw two", "retry": False, "metadata": None},
    }
    assert result.finish_reason == "other"


async def test_stream_effects_are_recorded_in_stream_order() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "a b"}, {"text": "unused"})
    seen: list[dict[str, Any]] = []

    def flag(chunk: dict[str, Any]) -> list[Any] | None:
        if chunk["type"] == "text-delta" and chunk["payload"]["text"] == "b ":
            signal = signal_record({"type": "reactive", "contents": "watch b"})
            return [StreamEffects([signal], [Violation("flagger", "b seen", {"n": 1})]), chunk]
        return None

    options = CallOptions(on_violation=seen.append)
    stream = agent(model, log, output=(FakeProcessor("flagger", stream_answer=flag),)).stream("hi", options)
    [_ async for _ in stream]
    result = await stream.result()

    assert result.violations == [{"processorId": "flagger", "message": "b seen", "detail": {"n": 1}}]
    assert seen == result.violations


async def test_a_reply_with_nothing_to_apply_still_records_its_violations() -> None:
    # what a shadow processor's call gives: its verdict is not enforced, its violations are kept
    log: list[Call] = []
    model = FakeModel({"text": "ok"})
    shadow = FakeProcessor(
        "shadow",
        {
            "process_llm_response": lambda args, info: reply(
                None, violations=[Violation("shadow", "would block", None)], abort=abort("shadow", "x")
            )
        },
    )
    result = await agent(model, log, input=(shadow,)).generate("hi")

    assert result.tripwire is None
    assert result.text == "ok "
    assert result.violations == [{"processorId": "shadow", "message": "would block", "detail": None}]


async def test_signals_from_a_hook_join_the_conversation() -> None:
    log: list[Call] = []
    model = FakeModel({"text": "ok"})
    notifier = FakeProcessor(
        "notifier",
        {
            "process_llm_response": lambda args, info: reply(
                LLMResponseResult(), signals=[{"type": "reactive", "contents": "remember"}]
            ),
            "process_output_result": lambda args, info: reply(MessagesResult()),
        },
    )
    stream = agent(model, log, input=(notifier,), output=(notifier,)).stream("hi")
    chunks = [c async for c in stream]
    await stream.result()

    [signal] = [c for c in chunks if c["type"] == "data-signal"]
    assert signal["data"]["contents"] == "remember"
    [result_call] = [c for c in log if c.args.hook == "process_output_result"]
    assert result_call.args.messages[0]["role"] == "assistant"
    assert message_text(result_call.args.messages[0]) == "ok "
