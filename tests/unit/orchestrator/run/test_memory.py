"""Memory's persistence rules in the loop, against fakes (SPEC §2-§5, issue 15 item 3 and 4)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from procmesh_orchestrator.errors import (
    APICallError,
    MemoryStoreError,
    StoreUnavailableError,
)
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.framework.memory import AgentMemory
from procmesh_orchestrator.run.hooks import (
    APIErrorResult,
    InputResult,
    InputStepResult,
    LLMRequestResult,
    MessagesResult,
    ToolResultResult,
)
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.run.tools import StaticTool
from tests.unit.orchestrator.run.fakes import Call, FakeModel, FakeProcessor, abort, agent, reply
from tests.unit.orchestrator.run.memory_store import DictStore

T1 = CallOptions(thread_id="t1", resource_id="u1")
U1T1 = ("u1", "t1")
"""T1's thread as the store keys it: thread ids are scoped by resource."""


def on_thread(**kw: Any) -> CallOptions:
    return CallOptions(thread_id="t1", resource_id="u1", **kw)


def stored(store: DictStore, thread: str = "t1", resource: str = "u1") -> list[tuple[str, str]]:
    return [(m["role"], message_text(m)) for m in store.rows.get((resource, thread), [])]


def prompt(request: ModelRequest) -> list[tuple[str, str]]:
    out = []
    for msg in request.prompt:
        content = msg["content"]
        text = content if isinstance(content, str) else "\n".join(p.get("text", "") for p in content)
        out.append((msg["role"], text))
    return out


def remembering(model: FakeModel, store: DictStore, *, last: int = 10, **kw: Any) -> Any:
    return agent(model, kw.pop("log", []), memory=AgentMemory(store, last, "dict://test"), **kw)


async def test_a_call_without_a_thread_neither_loads_nor_saves() -> None:
    store = DictStore()
    store.rows[U1T1] = []
    model = FakeModel({"text": "hi"})
    await remembering(model, store).generate("hello")
    assert store.saves == []


async def test_history_goes_ahead_of_the_input_and_process_input_sees_it() -> None:
    store, log = DictStore(), list[Call]()
    seen: list[list[str]] = []

    def look(args: Any, info: Any) -> Any:
        seen.append([message_text(m) for m in args.messages])
        return reply(InputResult())

    model = FakeModel({"text": "Nice to meet you"}, {"text": "Ada"})
    bot = remembering(model, store, log=log, input=(FakeProcessor("look", {"process_input": look}),))
    await bot.generate("I am Ada", T1)
    await bot.generate("Who am I?", T1)

    assert seen == [["I am Ada"], ["I am Ada", "Nice to meet you ", "Who am I?"]]
    assert prompt(model.requests[1]) == [
        ("user", "I am Ada"),
        ("assistant", "Nice to meet you "),
        ("user", "Who am I?"),
    ]
    # only this call's messages are saved, never the loaded history again
    assert [len(turn) for _, _, turn in store.saves] == [2, 2]


async def test_the_window_counts_stored_messages_and_a_leading_answer_gets_a_placeholder() -> None:
    store = DictStore()
    model = FakeModel({"text": "one"}, {"text": "two"}, {"text": "three"})
    bot = remembering(model, store, last=3)
    for question in ("q1", "q2", "q3"):
        await bot.generate(question, T1)
    assert prompt(model.requests[2]) == [
        ("user", "."),
        ("assistant", "one "),
        ("user", "q2"),
        ("assistant", "two "),
        ("user", "q3"),
    ]
    assert len(store.rows[U1T1]) == 6


@pytest.mark.parametrize("hook", ["process_output_result", "process_output_step"])
async def test_an_output_abort_saves_nothing_of_the_turn(hook: str) -> None:
    store = DictStore()
    answer = MessagesResult()
    guard = FakeProcessor("guard", {hook: lambda args, info: reply(answer, abort=abort("guard", "no"))})
    result = await remembering(FakeModel({"text": "bad"}), store, output=(guard,)).generate("hi", T1)
    assert result.tripwire is not None
    assert store.saves == []


async def test_an_output_stream_abort_saves_nothing_of_the_turn() -> None:
    store = DictStore()

    def block(chunk: dict[str, Any]) -> Any:
        return [abort("guard", "no")] if chunk["type"] == "text-delta" else None

    bot = remembering(FakeModel({"text": "bad words"}), store, output=(FakeProcessor("guard", {}, block),))
    stream = bot.stream("hi", T1)
    [c async for c in stream]
    assert (await stream.result()).tripwire is not None
    assert store.saves == []


async def test_an_input_tripwire_saves_nothing() -> None:
    store = DictStore()
    guard = FakeProcessor(
        "guard", {"process_input": lambda a, i: reply(InputResult(), abort=abort("g", "x"))}
    )
    await remembering(FakeModel({"text": "never"}), store, input=(guard,)).generate("hi", T1)
    assert store.saves == []


async def test_input_and_tool_result_rewrites_are_saved_as_rewritten_llm_request_rewrites_never() -> None:
    store = DictStore()

    def redact(args: Any, info: Any) -> Any:
        msgs = [dict(m) for m in args.messages]
        for m in msgs:
            m["content"] = {**m["content"], "parts": [{"type": "text", "text": "[card]"}]}
        return reply(InputResult(messages=msgs))

    def shorten(args: Any, info: Any) -> Any:
        return reply(LLMRequestResult(prompt=[{"role": "user", "content": "short"}]))

    def round_it(args: Any, info: Any) -> Any:
        return reply(ToolResultResult(replaced=True, result={"tempC": 20}))

    inputs = (
        FakeProcessor("redact", {"process_input": redact}),
        FakeProcessor("shorten", {"process_llm_request": shorten}),
    )
    model = FakeModel({"tool_calls": ["weather"]}, {"text": "done"})
    bot = remembering(
        model,
        store,
        input=inputs,
        output=(FakeProcessor("round", {"process_tool_result": round_it}),),
        tools={"weather": StaticTool("weather", "", {}, {"tempC": 21.4})},
    )
    await bot.generate("card 4111", T1)

    assert prompt(model.requests[0]) == [("user", "short")]
    rows = store.rows[U1T1]
    assert [(m["role"], message_text(m)) for m in rows] == [
        ("user", "[card]"),
        ("assistant", ""),
        ("assistant", "done "),
    ]
    [call] = [p["toolInvocation"] for p in rows[1]["content"]["parts"]]
    assert (call["toolName"], call["state"], call["result"]) == ("weather", "result", {"tempC": 20})


async def test_a_rejected_attempt_is_never_saved_its_feedback_is_as_a_signal() -> None:
    store = DictStore()

    def judge(args: Any, info: Any) -> Any:
        if "bad" in args.text:
            return reply(MessagesResult(), abort=abort("judge", "no bad", retry=True))
        return reply(MessagesResult())

    model = FakeModel({"text": "bad idea"}, {"text": "risky idea"})
    bot = remembering(model, store, output=(FakeProcessor("judge", {"process_output_step": judge}),))
    await bot.generate("skydive?", on_thread(max_processor_retries=2))
    assert stored(store) == [("user", "skydive?"), ("signal", "no bad"), ("assistant", "risky idea ")]
    recall = await store.messages("t1", "u1", include_signals=False)
    assert [m["role"] for m in recall] == ["user", "assistant"]


async def test_persistent_signals_are_saved_where_they_were_sent_transient_ones_never() -> None:
    store = DictStore()

    def steer(args: Any, info: Any) -> Any:
        if info.step_number:
            return reply(InputStepResult())
        return reply(
            InputStepResult(),
            signals=[
                {"type": "reactive", "contents": "prefers French", "attributes": {"kind": "pref"}},
                {"type": "reactive", "contents": "be brief", "transient": True},
            ],
        )

    model = FakeModel({"text": "oui"}, {"text": "bonjour"})
    bot = remembering(model, store)
    await bot.generate(
        "French please", on_thread(input_processors=[FakeProcessor("steer", {"process_input_step": steer})])
    )
    await bot.generate("hello", T1)

    assert stored(store) == [
        ("user", "French please"),
        ("signal", "prefers French"),
        ("assistant", "oui "),
        ("user", "hello"),
        ("assistant", "bonjour "),
    ]
    assert prompt(model.requests[1])[:3] == [
        ("user", "French please"),
        ("user", '<system-reminder kind="pref">prefers French</system-reminder>'),
        ("assistant", "oui "),
    ]


async def test_per_call_lists_replace_yours_and_memory_keeps_running_around_them() -> None:
    store, log = DictStore(), list[Call]()
    mine = FakeProcessor("mine", {"process_input": lambda a, i: reply(InputResult())})
    model = FakeModel({"text": "a"}, {"text": "b"})
    bot = remembering(model, store, log=log, input=(mine,))
    await bot.generate("one", T1)
    await bot.generate("two", on_thread(input_processors=[], output_processors=[], error_processors=[]))
    assert [c.processor for c in log] == ["mine"]
    assert prompt(model.requests[1])[0] == ("user", "one")
    assert len(store.saves) == 2


async def test_a_store_that_is_down_fails_the_run_saying_so_and_only_the_log_names_the_store(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = DictStore()
    store.down = True
    model = FakeModel({"text": "never"})
    with pytest.raises(StoreUnavailableError) as failed:
        await remembering(model, store).generate("hi", T1)
    assert str(failed.value) == "memory: loading thread 't1' failed: the memory store is unavailable"
    assert model.requests == []
    assert "dict://test is unreachable" in caplog.text  # the operator's log has the whole error


async def test_a_failed_save_fails_the_run_and_nothing_is_half_saved() -> None:
    store = DictStore()
    model = FakeModel({"text": "answer"})
    bot = remembering(model, store)

    async def fail(*args: Any) -> None:
        raise OSError("disk full")

    store.save_turn = fail  # type: ignore[method-assign,assignment]
    with pytest.raises(MemoryStoreError) as failed:
        await bot.generate("hi", T1)
    assert str(failed.value) == "memory: saving a turn to thread 't1' failed: the memory store failed"
    assert store.rows == {}


async def test_a_thread_needs_its_resource() -> None:
    with pytest.raises(MemoryStoreError, match="without a resource"):
        await remembering(FakeModel(), DictStore()).generate("hi", CallOptions(thread_id="t1"))


class TooLong(FakeModel):
    """Rejects a prompt of more than `limit` messages as a context-length error (a 400)."""

    def __init__(self, limit: int, *responses: dict[str, Any]) -> None:
        super().__init__(*responses)
        self.limit = limit

    async def stream(self, request: ModelRequest) -> AsyncIterator[dict[str, Any]]:
        if len(request.prompt) > self.limit:
            self.requests.append(request)
            raise APICallError("This model's maximum context length is 8192 tokens", status=400)
        async for chunk in super().stream(request):
            yield chunk


async def seeded(store: DictStore, turns: int) -> None:
    bot = remembering(FakeModel(*({"text": f"a{i}"} for i in range(turns))), store)
    for i in range(turns):
        await bot.generate(f"q{i}", T1)


async def test_a_context_length_rejection_drops_the_oldest_loaded_history_and_retries() -> None:
    store = DictStore()
    await seeded(store, 4)  # 8 stored messages
    model = TooLong(5, {"text": "fits"})
    result = await remembering(model, store, max_processor_retries=3).generate("q4", T1)

    assert result.text == "fits "
    # 9 messages, then the older half of the 8 loaded dropped (5 fit), this turn kept
    assert [len(r.prompt) for r in model.requests] == [9, 5]
    assert prompt(model.requests[-1]) == [
        ("user", "q2"),
        ("assistant", "a2 "),
        ("user", "q3"),
        ("assistant", "a3 "),
        ("user", "q4"),
    ]
    assert len(store.rows[U1T1]) == 10  # nothing stored was deleted; the turn was saved


async def test_memory_recovery_stays_with_a_per_call_error_list_and_runs_after_it() -> None:
    store, log = DictStore(), list[Call]()
    await seeded(store, 2)
    theirs = FakeProcessor("theirs", {"process_api_error": lambda a, i: reply(APIErrorResult())})
    model = TooLong(3, {"text": "fits"})
    bot = remembering(model, store, log=log, max_processor_retries=3)
    result = await bot.generate("q2", on_thread(error_processors=[theirs]))
    assert result.text == "fits "
    assert [c.processor for c in log] == ["theirs"]


async def test_memory_recovery_never_drops_this_turn() -> None:
    store = DictStore()
    await seeded(store, 1)
    model = TooLong(0)
    with pytest.raises(APICallError):
        await remembering(model, store, max_processor_retries=5).generate("q1", T1)
    # one retry without the two loaded messages, then nothing is left to drop
    assert [len(r.prompt) for r in model.requests] == [3, 1]


async def test_another_resource_using_the_thread_id_has_its_own_thread() -> None:
    store = DictStore()
    await seeded(store, 1)
    model = FakeModel({"text": "yours"})
    await remembering(model, store).generate("hi", CallOptions(thread_id="t1", resource_id="u2"))
    assert prompt(model.requests[0]) == [("user", "hi")]  # nothing of u1's thread 't1'
    assert stored(store, "t1", "u2") == [("user", "hi"), ("assistant", "yours ")]
    assert stored(store) == [("user", "q0"), ("assistant", "a0 ")]  # u1's thread untouched
