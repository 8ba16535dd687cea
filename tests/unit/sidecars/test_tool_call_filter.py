"""tool-call-filter's logic on provider prompts (the reference's tool-call-filter cases)."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_sidecars.builtins.tool_call_filter import (
    ToolCallFilter,
    ToolCallFilterOptions,
    filter_prompt,
    model_output_text,
)
from tests.unit.sidecars.helpers import assistant, call, result, user

PROMPT = [
    {"role": "system", "content": "sys"},
    user("weather and sum?"),
    call("c1", "weather", {"city": "NYC"}),
    result("c1", "weather", {"type": "text", "value": "Sunny"}),
    call("c2", "calculator", {"e": "2+2"}, text="adding"),
    result("c2", "calculator", {"type": "json", "value": {"n": 4.0}}),
    assistant("Sunny and 4."),
]


def opts(**kw: Any) -> ToolCallFilterOptions:
    return ToolCallFilterOptions(**kw)


def test_default_removes_all_calls_and_results_and_empty_messages() -> None:
    out = filter_prompt(PROMPT, opts(), history={"c1", "c2"})
    assert out == [PROMPT[0], PROMPT[1], assistant("adding"), PROMPT[6]]


def test_nothing_to_filter_returns_none() -> None:
    assert filter_prompt([user("hi"), assistant("hello")], opts(), history=set()) is None
    assert filter_prompt(PROMPT, opts(exclude=[]), history={"c1", "c2"}) is None
    assert filter_prompt(PROMPT, opts(exclude=["nonexistent"]), history={"c1", "c2"}) is None


def test_orphan_results_are_dropped() -> None:
    prompt = [user("q"), result("gone", "weather", "x"), assistant("a")]
    assert filter_prompt(prompt, opts(), history={"gone"}) == [user("q"), assistant("a")]


def test_exclude_filters_named_tools_as_pairs() -> None:
    out = filter_prompt(PROMPT, opts(exclude=["calculator"]), history={"c1", "c2"})
    assert out == [*PROMPT[:4], assistant("adding"), PROMPT[6]]


def test_preserve_model_output() -> None:
    out = filter_prompt(PROMPT, opts(preserve_model_output=True), history={"c1", "c2"})
    assert out is not None
    assert out[2] == assistant("weather result:\nSunny")
    assert out[3] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "adding"},
            {"type": "text", "text": 'calculator result:\n{"n":4}'},
        ],
    }
    assert "NYC" not in str(out)


@pytest.mark.parametrize(
    ("output", "text"),
    [
        ({"type": "text", "value": "plain"}, "plain"),
        ({"type": "json", "value": {"a": [1.0, 2.5]}}, '{"a":[1,2.5]}'),
        (
            {
                "type": "content",
                "value": [{"type": "text", "text": "x"}, {"type": "media"}, {"type": "text", "text": "y"}],
            },
            "x\ny",
        ),
        ("raw result", None),
        ({"type": "text"}, None),
    ],
)
def test_model_output_provenance(output: Any, text: str | None) -> None:
    assert model_output_text(output) == text


LOOP = [
    user("go"),
    call("r1", "a"),
    result("r1", "a", 1),
    call("r2", "b"),
    result("r2", "b", 2),
    call("r3", "c"),
    result("r3", "c", 3),
]


@pytest.mark.parametrize(("n", "kept"), [(0, []), (1, ["r3"]), (2, ["r2", "r3"])])
def test_filter_after_tool_steps(n: int, kept: list[str]) -> None:
    out = filter_prompt(LOOP, opts(filter_after_tool_steps=n), history=set()) or LOOP
    ids = [p["toolCallId"] for m in out for p in m["content"] if p["type"] == "tool-call"]
    assert ids == kept


async def test_first_prompt_is_history_later_calls_are_preserved() -> None:
    processor, state = ToolCallFilter(), {}
    first = [user("q"), call("h1", "a"), result("h1", "a", 1), user("again")]
    out = await processor.process_llm_request(first, opts(), state)
    assert out == {"prompt": [user("q"), user("again")]}
    later = [*first, call("n1", "a"), result("n1", "a", 2)]
    out = await processor.process_llm_request(later, opts(), state)
    assert out == {"prompt": [user("q"), user("again"), call("n1", "a"), result("n1", "a", 2)]}
