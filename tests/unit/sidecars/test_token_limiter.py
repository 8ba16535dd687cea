"""token-limiter's logic, called directly (the reference's token-limiter cases)."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh import TripWire
from procmesh_sidecars.builtins.token_limiter import TokenLimiter, TokenLimiterOptions, media_tokens
from tests.unit.sidecars.helpers import Writer, abort, assistant, call, result, user

SYSTEM = {"role": "system", "content": "You are terse."}


async def request(prompt: list[dict[str, Any]], state: dict[str, Any] | None = None, **opts: Any) -> Any:
    return await TokenLimiter().process_llm_request(
        prompt, TokenLimiterOptions(**opts), {} if state is None else state, abort
    )


async def test_tripwire_on_empty_messages() -> None:
    with pytest.raises(TripWire, match="No messages to process"):
        await request([SYSTEM], limit=100)


async def test_tripwire_when_system_alone_is_over() -> None:
    with pytest.raises(TripWire, match="System messages alone exceed token limit") as info:
        await request([SYSTEM, user("hi")], limit=8)
    assert info.value.metadata == {"systemTokens": 8.0, "limit": 8}


async def test_tripwire_when_nothing_fits() -> None:
    with pytest.raises(TripWire, match="No messages fit") as info:
        await request([SYSTEM, user("word " * 50)], limit=20)
    assert info.value.metadata["messageCount"] == 1


async def test_untouched_prompt_returns_none() -> None:
    assert await request([SYSTEM, user("hi")], limit=1000) is None


async def test_newest_first_and_system_kept() -> None:
    prompt = [SYSTEM, user("old " * 40), assistant("older answer " * 40), user("newest")]
    out = await request(prompt, limit=60)
    assert out == {"prompt": [SYSTEM, user("newest")]}


async def test_assistant_and_tool_messages_are_dropped_together() -> None:
    history = [
        SYSTEM,
        user("q"),
        call("h1", "lookup", {"q": "x"}),
        result("h1", "lookup", "y" * 400),
        user("now"),
    ]
    state: dict[str, Any] = {}
    out = await request(history, state, limit=40)
    assert out == {"prompt": [SYSTEM, user("q"), user("now")]}
    assert state["historyToolCallIds"] == ["h1"]


async def test_this_runs_tool_calls_are_never_dropped() -> None:
    state: dict[str, Any] = {"historyToolCallIds": []}  # the first prompt had no tool calls: c1 is this run's
    prompt = [SYSTEM, user("old " * 30), user("ask"), call("c1", "lookup"), result("c1", "lookup", "z" * 300)]
    out = await request(prompt, state, limit=120)
    assert out is not None
    kept = out["prompt"]
    assert kept[-2:] == prompt[-2:]
    assert user("old " * 30) not in kept


async def test_estimator_overheads() -> None:
    limiter = TokenLimiter()
    options = TokenLimiterOptions(limit=10, token_counter="estimate")
    with pytest.raises(TripWire, match="System messages alone") as info:
        await limiter.process_llm_request([SYSTEM, user("x")], options, {}, abort)
    # role + content estimated, + 3.8 per message; + 24 per conversation is over the limit
    assert info.value.metadata["systemTokens"] == pytest.approx(5 + 3.8)  # "systemYou" "are" "terse" "."


def test_media_estimates() -> None:
    assert media_tokens("https://x/y.png", "image/png") == 765
    assert media_tokens("https://x/doc.pdf", "application/pdf") == 258
    assert media_tokens(b"a" * 400, "application/pdf") == 100
    assert media_tokens("data:text/plain;base64," + "QUJD" * 100, "text/plain") == 75


async def test_output_cumulative_truncate_and_single_notice() -> None:
    limiter = TokenLimiter()
    options = TokenLimiterOptions(limit=3)
    state: dict[str, Any] = {}

    writer = Writer()
    parts = [{"type": "text-delta", "payload": {"text": t}} for t in ["one", " two", " three four", " five"]]
    out = [await limiter.process_output_stream(p, options, state, abort, writer) for p in parts]
    assert [o["payload"]["text"] if o else None for o in out] == ["one", " two", " three", None]
    assert len(writer.chunks) == 1
    assert writer.chunks[0]["transient"] is True
    assert state["currentTokens"] == 5
    lifecycle = {"type": "step-start", "payload": {}}
    assert await limiter.process_output_stream(lifecycle, options, state, abort, writer) is lifecycle


async def test_output_abort_message() -> None:
    options = TokenLimiterOptions(limit=5, strategy="abort")
    part = {"type": "text-delta", "payload": {"text": "a b c d e f g"}}
    with pytest.raises(TripWire, match=r"Token limit of 5 exceeded \(current: 7\)"):
        await TokenLimiter().process_output_stream(part, options, {}, abort, None)


async def test_output_result_truncates_text_parts() -> None:
    messages = [
        {
            "id": "a",
            "role": "assistant",
            "content": {
                "format": 2,
                "parts": [{"type": "text", "text": "one two"}, {"type": "text", "text": " three four"}],
            },
        },
    ]
    out = await TokenLimiter().process_output_result(messages, TokenLimiterOptions(limit=3), abort)
    assert out is not None
    assert [p["text"] for p in out[0]["content"]["parts"]] == ["one two", " three"]
    assert await TokenLimiter().process_output_result(messages, TokenLimiterOptions(limit=50), abort) is None


def _db(msg_id: str, role: str, text: str, *, stored: bool, tool: str = "") -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    if tool:
        inv = {"state": "result", "toolCallId": tool, "toolName": "t", "args": {}, "result": "ok"}
        parts.append({"type": "tool-invocation", "toolInvocation": inv})
    msg: dict[str, Any] = {"id": msg_id, "role": role, "content": {"format": 2, "parts": parts}}
    if stored:  # what the store stamps on every message it saved
        msg["threadId"], msg["resourceId"] = "t1", "u1"
    return msg


async def memory_only(messages: list[dict[str, Any]], **opts: Any) -> list[str] | None:
    out = await TokenLimiter().process_input(
        messages, [], TokenLimiterOptions(token_counter="estimate", trim_mode="memory-only", **opts)
    )
    return None if out is None else [m["id"] for m in out]


async def test_memory_only_drops_oldest_loaded_history_and_never_the_input() -> None:
    words = " ".join(["lorem"] * 40)
    history = [_db(f"h{i}", "user" if i % 2 == 0 else "assistant", words, stored=True) for i in range(6)]
    question = _db("q", "user", words, stored=False)
    assert await memory_only([*history, question], limit=10_000) is None  # fits: untouched
    kept = await memory_only([*history, question], limit=150)
    assert kept is not None
    assert kept[-1] == "q"
    assert kept == [m["id"] for m in history[len(history) - len(kept) + 1 :]] + ["q"]  # a suffix: oldest go
    # Even when nothing of the history fits, this call's input stays (memory-only trims memory only).
    assert await memory_only([*history, question], limit=20) == ["q"]


async def test_memory_only_keeps_tool_pairs_whole_and_frees_below_the_limit() -> None:
    words = " ".join(["lorem"] * 40)
    call_msg = _db("h0", "assistant", words, stored=True, tool="c1")
    answer = {**_db("h1", "tool", words, stored=True, tool="c1")}
    rest = [_db(f"h{i}", "user", words, stored=True) for i in range(2, 5)]
    question = _db("q", "user", "hi", stored=False)
    kept = await memory_only([call_msg, answer, *rest, question], limit=160, at_max_remove_tokens=0)
    assert kept is not None
    assert "h1" not in kept
    assert "h0" not in kept
    more_room = await memory_only([call_msg, answer, *rest, question], limit=160, at_max_remove_tokens=100)
    assert more_room is not None
    assert len(more_room) < len(kept)


async def test_other_modes_leave_process_input_alone() -> None:
    history = [
        _db("h0", "user", " ".join(["lorem"] * 400), stored=True),
        _db("q", "user", "hi", stored=False),
    ]
    assert await TokenLimiter().process_input(history, [], TokenLimiterOptions(limit=10)) is None


def test_memory_only_room_cannot_exceed_the_limit() -> None:
    with pytest.raises(ValueError, match="at_max_remove_tokens cannot exceed limit"):
        TokenLimiterOptions(limit=10, trim_mode="memory-only", at_max_remove_tokens=11)
