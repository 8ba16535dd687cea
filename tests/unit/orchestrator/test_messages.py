"""The run's message list, signals as the model sees them, and the provider prompt."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.messages import RunMessages, build_prompt, render_signal, text_message


def signal(**fields: Any) -> dict[str, Any]:
    """A signal message as RunMessages stores it."""
    msg, _ = RunMessages().add_signal({"type": "reactive", **fields})
    return msg


def assistant(text: str, *invocations: dict[str, Any]) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    parts += [{"type": "tool-invocation", "toolInvocation": inv} for inv in invocations]
    return {"id": msgs.new_id(), "role": "assistant", "content": {"format": 2, "parts": parts}}


# -- build_prompt ----------------------------------------------------------------------------


def test_prompt_puts_system_messages_first_and_skips_empty_ones() -> None:
    systems = [
        text_message("system", "You are helpful."),
        text_message("system", ""),
        text_message("system", "Be brief."),
    ]
    prompt = build_prompt(systems, [text_message("user", "hi")])
    assert prompt == [
        {"role": "system", "content": "You are helpful."},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]


def test_prompt_assistant_tool_calls_then_tool_results() -> None:
    call = {"state": "result", "toolCallId": "c1", "toolName": "weather", "args": {"city": "Paris"}}
    pending = {"state": "call", "toolCallId": "c2", "toolName": "clock", "args": {}}
    messages = [
        text_message("user", "weather?"),
        assistant("Let me check.", {**call, "result": {"temp": 21}}, pending),
        text_message("user", "thanks"),
    ]
    prompt = build_prompt([], messages)
    assert [m["role"] for m in prompt] == ["user", "assistant", "tool", "user"]
    # the call without a result is left out (a provider rejects a call with no result after it)
    assert prompt[1]["content"] == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool-call", "toolCallId": "c1", "toolName": "weather", "input": {"city": "Paris"}},
    ]
    assert prompt[2]["content"] == [
        {"type": "tool-result", "toolCallId": "c1", "toolName": "weather", "output": {"temp": 21}}
    ]


def _called(call_id: str, *, provider: bool = False) -> dict[str, Any]:
    """An invocation in state ``call`` (no result), provider-executed with `provider`."""
    inv = {"state": "call", "toolCallId": call_id, "toolName": "web_search", "args": {"q": "x"}}
    return {**inv, "providerExecuted": True} if provider else inv


def _call_ids(prompt: list[dict[str, Any]]) -> list[str]:
    return [
        p["toolCallId"] for m in prompt if m["role"] != "system" for p in m["content"] if "toolCallId" in p
    ]


def test_prompt_leaves_out_an_assistant_message_holding_only_unanswered_calls() -> None:
    messages = [text_message("user", "weather?"), assistant("", _called("c1"))]
    assert build_prompt([], messages) == [{"role": "user", "content": [{"type": "text", "text": "weather?"}]}]


@pytest.mark.parametrize(
    ("after", "kept"),
    [
        ([], ["p1"]),  # the open turn: the provider may still answer it
        ([text_message("user", "and?")], []),  # a user turn followed it
        ([signal(contents="note")], []),  # a signal is a user turn
        ([assistant("later")], []),  # a later assistant message is the open turn
        ([assistant("", _called("c9"))], ["p1"]),  # one showing nothing is not
    ],
    ids=["open", "user-after", "signal-after", "assistant-after", "empty-assistant-after"],
)
def test_prompt_keeps_an_unanswered_provider_executed_call_on_the_open_turn_only(
    after: list[dict[str, Any]], kept: list[str]
) -> None:
    messages = [text_message("user", "search"), assistant("looking", _called("p1", provider=True)), *after]
    assert _call_ids(build_prompt([], messages)) == kept


def test_prompt_renders_signals_as_user_turns() -> None:
    messages = [text_message("user", "hi"), signal(contents="Be short.")]
    prompt = build_prompt([], messages)
    assert prompt[-1] == {
        "role": "user",
        "content": [{"type": "text", "text": "<system-reminder>Be short.</system-reminder>"}],
    }


def test_prompt_drops_an_assistant_message_without_content() -> None:
    assert build_prompt([], [text_message("user", "hi"), assistant("")]) == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    ]


# -- render_signal -----------------------------------------------------------------------------


def test_signal_attributes_are_strings() -> None:
    msg = signal(
        contents="x",
        attributes={
            "n": 3,
            "ratio": 2.0,
            "half": 0.5,
            "ok": True,
            "no": False,
            "obj": {"a": [1]},
            "gone": None,
        },
    )
    assert render_signal(msg) == (
        '<system-reminder n="3" ratio="2" half="0.5" ok="true" no="false" obj="{&quot;a&quot;:[1]}">'
        "x</system-reminder>"
    )


def test_signal_escapes_contents_and_attribute_quotes() -> None:
    msg = signal(contents='if a < b && c > d "quoted"', attributes={"q": 'say "hi" <now>'})
    assert render_signal(msg) == (
        '<system-reminder q="say &quot;hi&quot; &lt;now&gt;">'
        'if a &lt; b &amp;&amp; c &gt; d "quoted"</system-reminder>'
    )


def test_empty_signal_is_self_closing() -> None:
    assert render_signal(signal(contents="", attributes={"k": "v"})) == '<system-reminder k="v" />'
    assert render_signal(signal(contents="", tagName="ping")) == "<ping />"


@pytest.mark.parametrize(
    ("kind", "tag"),
    [("notification", "notification"), ("state", "state"), ("system-reminder", "system-reminder")],
)
def test_signal_default_tags(kind: str, tag: str) -> None:
    msg, data = RunMessages().add_signal({"type": kind, "contents": "c"})
    assert render_signal(msg) == f"<{tag}>c</{tag}>"
    assert data["tagName"] == tag


def test_user_signal_without_attributes_is_plain_text() -> None:
    msg, data = RunMessages().add_signal({"type": "user-message", "contents": "a < b"})
    assert render_signal(msg) == "a < b"
    assert data["type"] == "user"


def test_custom_tag_name() -> None:
    assert render_signal(signal(contents="hi", tagName="note")) == "<note>hi</note>"


# -- RunMessages.apply ---------------------------------------------------------------------------


def make_list() -> tuple[RunMessages, list[dict[str, Any]]]:
    ml = RunMessages()
    items = [text_message("user", t) for t in ("a", "b", "c")]
    for m in items:
        ml.add(m, msgs.INPUT)
    return ml, items


def texts(ml: RunMessages) -> list[str]:
    return [msgs.message_text(m) for m in ml.items]


def test_apply_removes_replaces_in_place_and_appends() -> None:
    ml, (a, b, c) = make_list()
    reply = ml.add_signal({"type": "reactive", "contents": "kept"})[0]  # not part of `before`
    before = ml.view(msgs.INPUT)[:3]
    new = text_message("user", "d")
    returned = [new, text_message("user", "C!", msg_id=c["id"]), a]  # b missing: removed
    systems = ml.apply(before, returned, msgs.RESPONSE)
    assert systems == []
    assert texts(ml) == ["a", "C!", "kept", "d"]  # c replaced where it was; d appended
    assert ml.sources[c["id"]] == msgs.INPUT  # a replaced message keeps its source
    assert ml.sources[new["id"]] == msgs.RESPONSE
    assert b["id"] not in ml.sources
    assert ml.view(msgs.INPUT)[-1] is reply  # outside `before`: untouched


def test_apply_extracts_system_role_messages() -> None:
    ml, (a, b, c) = make_list()
    sys_new = text_message("system", "new rule")
    sys_from_b = text_message("system", "b became a rule", msg_id=b["id"])
    systems = ml.apply(list(ml.items), [a, sys_from_b, c, sys_new], msgs.INPUT)
    assert systems == [sys_from_b, sys_new]
    assert texts(ml) == ["a", "c"]
    assert all(m["role"] != "system" for m in ml.items)


def test_apply_leaves_messages_outside_the_view_alone() -> None:
    ml, (a, _, _) = make_list()
    answer = text_message("assistant", "answer")
    ml.add(answer, msgs.RESPONSE)
    ml.apply(ml.view(msgs.RESPONSE), [], msgs.RESPONSE)
    assert texts(ml) == ["a", "b", "c"]
    ml.apply(ml.view(msgs.INPUT), [a], msgs.INPUT)
    assert texts(ml) == ["a"]


def test_replace_all() -> None:
    ml, (a, _, _) = make_list()
    sys_msg = text_message("system", "s")
    assert ml.replace_all([sys_msg, a], msgs.INPUT) == [sys_msg]
    assert texts(ml) == ["a"]


# -- signals in the list ----------------------------------------------------------------------------


def signal_texts(ml: RunMessages) -> list[str]:
    return [msgs.message_text(m) if m["role"] == "signal" else "<msg>" for m in ml.items]


def test_transient_signal_dedup_moves_it_to_the_end() -> None:
    ml, _ = make_list()
    ml.add_signal({"type": "reactive", "contents": "budget: 3", "transient": True})
    ml.add(text_message("assistant", "ok"), msgs.RESPONSE)
    _, data = ml.add_signal({"type": "reactive", "contents": "budget: 3", "transient": True})
    assert signal_texts(ml) == ["<msg>", "<msg>", "<msg>", "<msg>", "budget: 3"]
    assert data["transient"] is True
    assert data["contents"] == "budget: 3"


def test_transient_signals_with_other_contents_or_tag_are_kept() -> None:
    ml = RunMessages()
    ml.add_signal({"type": "reactive", "contents": "a", "transient": True})
    ml.add_signal({"type": "reactive", "contents": "b", "transient": True})
    ml.add_signal({"type": "reactive", "contents": "a", "tagName": "other", "transient": True})
    ml.add_signal({"type": "reactive", "contents": "a"})  # persistent: never replaces a transient one
    assert signal_texts(ml) == ["a", "b", "a", "a"]


def test_persistent_signal_adds_a_copy_each_time() -> None:
    ml, _ = make_list()
    ml.add_signal({"type": "reactive", "contents": "retry please"})
    ml.add_signal({"type": "reactive", "contents": "retry please"})
    assert signal_texts(ml)[-2:] == ["retry please", "retry please"]
    assert len(ml.items) == 5


def test_signal_message_shape_and_data_payload() -> None:
    ml = RunMessages()
    msg, data = ml.add_signal(
        {"type": "system-reminder", "contents": "c", "attributes": {"k": 1}, "metadata": {"m": 1}}
    )
    assert msg["role"] == "signal"
    info = msg["content"]["metadata"]["signal"]
    assert (info["type"], info["tagName"], info["attributes"], info["metadata"]) == (
        "reactive",
        "system-reminder",
        {"k": 1},
        {"m": 1},
    )
    assert "transient" not in info
    assert "metadata" not in data  # the chunk carries no metadata
    assert data["contents"] == "c"
    assert ml.sources[msg["id"]] == msgs.INPUT


@pytest.mark.timeout(20)  # quadratic handling took ~60 s for 50,000 messages; linear takes well under 1 s
def test_applying_a_hook_return_over_many_messages_is_linear() -> None:
    ml = RunMessages()
    for i in range(50_000):
        ml.add({"id": f"m{i}", "role": "user", "content": {"format": 2, "parts": []}}, "input")
    before = ml.view()
    returned = [dict(m) for m in before if m["id"] != "m7"]  # every message returned, one dropped
    assert ml.apply(before, returned, "input") == []
    assert len(ml.items) == 49_999
    assert ml.items[0]["id"] == "m0"
    assert ml.items[7]["id"] == "m8"
    ml.replace_all(list(reversed(ml.items)), "input")  # known ids keep their place
    assert ml.items[0]["id"] == "m0"
