"""Property tests for procmesh.convert: the one proto <-> dict mapping both sides of the wire use."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procmesh import convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as pb

# No example database: it would leave a .hypothesis/ directory in the work tree.
PROPERTY = settings(database=None, deadline=None, max_examples=60)

# Every int a double holds exactly; larger ints come back as floats (JSON numbers are doubles).
SAFE_INT = 2**53 - 1
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-SAFE_INT, max_value=SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
nonempty_objects = st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=4)
words = st.text(alphabet=string.ascii_lowercase + string.digits + "-_", min_size=1, max_size=10)
texts = st.text(max_size=20)
nonempty_texts = st.text(min_size=1, max_size=20)


def canonical(obj: Any) -> Any:
    """What a JSON value looks like after the wire: integral floats (within 2**53) are ints."""
    if isinstance(obj, float) and obj.is_integer() and abs(obj) < 2**53:
        return int(obj)
    if isinstance(obj, dict):
        return {k: canonical(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [canonical(v) for v in obj]
    return obj


def typed(obj: Any) -> Any:
    """A comparison form where 1, 1.0 and True differ (plain == treats them as equal)."""
    if isinstance(obj, dict):
        return {k: typed(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [typed(v) for v in obj]
    return (type(obj).__name__, obj)


def assert_same(actual: Any, expected: Any) -> None:
    assert typed(actual) == typed(expected), f"{actual!r} != {expected!r}"


# -- JSON values -----------------------------------------------------------------


@PROPERTY
@given(json_values)
def test_value_round_trip_preserves_json_values(value: Any) -> None:
    assert_same(convert.from_value(convert.to_value(value)), canonical(value))


@PROPERTY
@given(json_values)
def test_value_round_trip_survives_serialization(value: Any) -> None:
    wire = convert.to_value(value).SerializeToString()
    assert_same(convert.from_value(convert.to_value(value).FromString(wire)), canonical(value))


@PROPERTY
@given(json_objects)
def test_struct_round_trip(obj: dict[str, Any]) -> None:
    assert_same(convert.from_struct(convert.to_struct(obj)), canonical(obj))


def test_integral_floats_come_back_as_ints_and_others_stay_floats() -> None:
    assert_same(convert.from_value(convert.to_value(3.0)), 3)
    assert_same(convert.from_value(convert.to_value(-0.0)), 0)
    assert_same(convert.from_value(convert.to_value(2.5)), 2.5)
    assert_same(convert.from_value(convert.to_value(1e300)), 1e300)
    assert_same(convert.from_value(convert.to_value(True)), True)


def test_to_struct_of_none_is_empty() -> None:
    assert convert.to_struct(None) == convert.to_struct({})
    assert convert.from_struct(convert.to_struct(None)) == {}


@pytest.mark.parametrize("bad", [{1, 2}, object(), b"bytes", {"k": {1: "int key"}}])
def test_non_json_values_raise_type_error(bad: Any) -> None:
    with pytest.raises(TypeError):
        convert.to_value(bad)


# -- messages --------------------------------------------------------------------


def _tool_invocation(
    state: str, call_id: str, name: str, args: Any, result: Any, has_result: bool, error_text: str
) -> dict[str, Any]:
    inv: dict[str, Any] = {"state": state, "toolCallId": call_id, "toolName": name, "args": args}
    if has_result:
        inv["result"] = result
    if error_text:
        inv["errorText"] = error_text
    return {"type": "tool-invocation", "toolInvocation": inv}


def _file(media_type: str, data: str | bytes, filename: str) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "file", "mediaType": media_type, "data": data}
    if filename:
        part["filename"] = filename
    return part


parts = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(lambda t: {"type": "reasoning", "text": t}, texts),
    st.builds(
        _tool_invocation,
        st.sampled_from(["call", "result", "output-error"]),
        words,
        words,
        json_values,
        json_values,
        st.booleans(),
        texts,
    ),
    st.builds(
        _file,
        st.sampled_from(["image/png", "application/pdf", ""]),
        # Empty bytes have no wire form distinct from an empty URL.
        st.text(min_size=1, max_size=30) | st.binary(min_size=1, max_size=30),
        texts,
    ),
    st.builds(lambda name, data: {"type": f"data-{name}", "data": data}, words, json_values),
    st.just({"type": "step-start"}),
)


@st.composite
def messages(draw: st.DrawFn) -> dict[str, Any]:
    content: dict[str, Any] = {"format": 2, "parts": draw(st.lists(parts, max_size=5))}
    if draw(st.booleans()):
        content["metadata"] = draw(nonempty_objects)
    msg: dict[str, Any] = {
        "id": draw(texts),
        "role": draw(st.sampled_from(["user", "assistant", "system", "tool", "signal"])),
        "content": content,
    }
    for key in ("createdAt", "threadId", "resourceId", "type"):
        if draw(st.booleans()):
            msg[key] = draw(nonempty_texts)
    return msg


@PROPERTY
@given(messages())
def test_message_round_trip(msg: dict[str, Any]) -> None:
    wire = convert.message_to_proto(msg).SerializeToString()
    assert_same(convert.message_from_proto(pb.Message.FromString(wire)), canonical(msg))


def test_message_parts_use_their_typed_oneof() -> None:
    msg = {
        "id": "m1",
        "role": "assistant",
        "content": {
            "format": 2,
            "parts": [
                {"type": "text", "text": "hi"},
                _tool_invocation("result", "c1", "search", {"q": "x"}, [1, 2], True, ""),
                _file("image/png", b"\x89PNG", "a.png"),
                {"type": "data-card", "data": {"n": 1}},
                {"type": "step-start"},
            ],
        },
    }
    proto = convert.message_to_proto(msg)
    kinds = [p.WhichOneof("kind") for p in proto.content.parts]
    assert kinds == ["text", "tool_invocation", "file", "data", "step_start"]
    assert proto.content.parts[2].file.data == b"\x89PNG"
    assert proto.content.parts[2].file.url == ""
    assert proto.content.format == 2


def test_string_content_becomes_one_text_part() -> None:
    out = convert.message_from_proto(convert.message_to_proto({"id": "m", "role": "user", "content": "hi"}))
    assert out["content"]["parts"] == [{"type": "text", "text": "hi"}]


def test_unsupported_part_type_raises_value_error() -> None:
    msg = {"id": "m", "role": "user", "content": {"parts": [{"type": "video", "url": "x"}]}}
    with pytest.raises(ValueError, match="unsupported message part type 'video'"):
        convert.message_to_proto(msg)


def test_part_without_kind_raises_value_error() -> None:
    # The orchestrator's reading (a sidecar's reply): it knows every kind of its contract.
    proto = pb.Message(id="m", role="user", content=pb.MessageContent(parts=[pb.Part()]))
    with pytest.raises(ValueError, match="no kind set"):
        convert.message_from_proto(proto)


@pytest.mark.parametrize("wire", [b"", b"\x7a\x03\x0a\x01x", b"\x0a\x03\x0a\x01z\x98\x06\x07"])
def test_a_part_of_an_unknown_kind_comes_back_as_it_came_when_kept(wire: bytes) -> None:
    # A sidecar's reading: a newer orchestrator's kind (field 15, or text plus an unknown field 99)
    # and a part with nothing set are shown as procmesh-unknown and written back byte for byte.
    proto = pb.Message(id="m", role="user")
    proto.content.parts.add().MergeFromString(wire)
    shown = convert.message_from_proto(proto, keep_unknown=True)
    if wire.startswith(b"\x0a"):  # a known kind with an unknown field beside it: read as text
        assert shown["content"]["parts"] == [{"type": "text", "text": "z"}]
        return
    assert shown["content"]["parts"][0]["type"] == "procmesh-unknown"
    assert convert.message_to_proto(shown).content.parts[0].SerializeToString() == wire


# -- chunks ----------------------------------------------------------------------

KNOWN_CHUNK_TYPES = {"text-delta", "tool-call", "tool-result", "finish", "tripwire", "error"}


@st.composite
def chunks(draw: st.DrawFn) -> tuple[dict[str, Any], str | None]:
    """A chunk dict and the proto oneof its payload must travel in."""
    kind = draw(st.sampled_from([*sorted(KNOWN_CHUNK_TYPES), "data", "other"]))
    if kind == "text-delta":
        payload: dict[str, Any] = {"text": draw(texts)}
        if draw(st.booleans()):
            payload["id"] = draw(nonempty_texts)
        return {"type": kind, "payload": payload}, "text_delta"
    if kind == "tool-call":
        payload = {"toolCallId": draw(words), "toolName": draw(words), "args": draw(json_values)}
        if draw(st.booleans()):  # a client tool's call carries the run's request context
            payload["requestContext"] = draw(st.dictionaries(words, json_values, max_size=3))
        return {"type": kind, "payload": payload}, "tool_call"
    if kind == "tool-result":
        payload = {
            "toolCallId": draw(words),
            "toolName": draw(words),
            "args": draw(json_values),
            "result": draw(json_values),
        }
        if draw(st.booleans()):
            payload["providerExecuted"] = True
        return {"type": kind, "payload": payload}, "tool_result"
    if kind == "finish":
        tokens = st.integers(min_value=0, max_value=2**40)
        inp, outp = draw(tokens), draw(tokens)
        usage = {"inputTokens": inp, "outputTokens": outp, "totalTokens": inp + outp + draw(tokens)}
        payload = {"finishReason": draw(st.sampled_from(["stop", "tool-calls", "length"])), "usage": usage}
        if draw(st.booleans()):
            payload["metadata"] = draw(nonempty_objects)
        return {"type": kind, "payload": payload}, "finish"
    if kind == "tripwire":
        payload = {
            "processorId": draw(texts),
            "reason": draw(texts),
            "retry": draw(st.booleans()),
            "metadata": draw(st.none() | nonempty_objects | st.lists(json_values, max_size=3)),
        }
        return {"type": kind, "payload": payload}, "tripwire"
    if kind == "error":
        return {"type": kind, "payload": {"message": draw(texts)}}, "error"
    if kind == "data":
        chunk: dict[str, Any] = {"type": f"data-{draw(words)}", "data": draw(json_values)}
        if draw(st.booleans()):
            chunk["transient"] = True
        return chunk, "data"
    other_type = draw(words.filter(lambda t: t not in KNOWN_CHUNK_TYPES and not t.startswith("data-")))
    payload = draw(json_objects)
    return {"type": other_type, "payload": payload}, ("other" if payload else None)


@PROPERTY
@given(chunks())
def test_chunk_round_trip(case: tuple[dict[str, Any], str | None]) -> None:
    chunk, oneof = case
    proto = convert.chunk_to_proto(chunk)
    assert proto.WhichOneof("payload") == oneof
    wire = proto.SerializeToString()
    assert_same(convert.chunk_from_proto(pb.Chunk.FromString(wire)), canonical(chunk))


def test_finish_without_total_tokens_sums_input_and_output() -> None:
    chunk = {
        "type": "finish",
        "payload": {"finishReason": "stop", "usage": {"inputTokens": 3, "outputTokens": 4}},
    }
    out = convert.chunk_from_proto(convert.chunk_to_proto(chunk))
    assert out["payload"]["usage"] == {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}


def test_transient_flag_is_only_set_for_data_chunks_that_ask_for_it() -> None:
    assert convert.chunk_to_proto({"type": "data-x", "data": 1, "transient": True}).transient
    assert not convert.chunk_to_proto({"type": "data-x", "data": 1}).transient
    assert "transient" not in convert.chunk_from_proto(convert.chunk_to_proto({"type": "data-x", "data": 1}))


def test_unknown_chunk_type_travels_in_other() -> None:
    chunk = {"type": "source", "payload": {"url": "https://example.com", "rank": 2}}
    proto = convert.chunk_to_proto(chunk)
    assert proto.WhichOneof("payload") == "other"
    assert convert.from_struct(proto.other) == chunk["payload"]
    assert convert.chunk_from_proto(proto) == chunk


# -- signals ---------------------------------------------------------------------

attribute_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,8}", fullmatch=True)


@PROPERTY
@given(st.lists(st.tuples(attribute_names, json_values), min_size=2, max_size=8, unique_by=lambda a: a[0]))
def test_signal_attribute_order_is_preserved(attributes: list[tuple[str, Any]]) -> None:
    names = [name for name, _ in attributes]
    signal = {"type": "reactive", "contents": "c", "attributes": dict(attributes)}
    proto = pb.Signal.FromString(convert.signal_to_proto(signal).SerializeToString())
    assert [a.name for a in proto.attributes] == names
    back = convert.signal_from_proto(proto)
    assert list(back["attributes"]) == names
    assert_same(back["attributes"], canonical(dict(attributes)))


@PROPERTY
@given(
    st.sampled_from(["reactive", "user", "notification", "state"]),
    texts,
    st.none() | attribute_names,
    st.booleans(),
    st.none() | nonempty_objects,
    st.none() | nonempty_texts,
)
def test_signal_round_trip(
    kind: str, contents: str, tag: str | None, transient: bool, metadata: Any, signal_id: str | None
) -> None:
    signal: dict[str, Any] = {"type": kind, "contents": contents}
    if tag is not None:
        signal["tagName"] = tag
    if transient:
        signal["transient"] = True
    if metadata is not None:
        signal["metadata"] = metadata
    if signal_id is not None:
        signal["id"] = signal_id
    assert_same(convert.signal_from_proto(convert.signal_to_proto(signal)), canonical(signal))


def test_signal_with_non_string_contents_raises() -> None:
    with pytest.raises(ValueError, match="contents must be a string"):
        convert.signal_to_proto({"type": "reactive", "contents": 3})


# -- prompts and steps -------------------------------------------------------------


def test_prompt_round_trip() -> None:
    prompt: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool-call", "toolCallId": "c1", "toolName": "add", "input": {"a": 1}}],
        },
        {
            "role": "tool",
            "content": [{"type": "tool-result", "toolCallId": "c1", "toolName": "add", "output": 3}],
        },
        {"role": "user", "content": [{"type": "file", "mediaType": "image/png", "data": b"\x00\x01"}]},
    ]
    req = ppb.ProcessLLMRequestRequest()
    convert.prompt_to_proto(prompt, req.prompt)
    assert convert.prompt_from_proto(req.prompt) == prompt


def test_provenance_crosses_the_contract_in_prompts_and_messages() -> None:
    prompt: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "file", "mediaType": "text/plain", "data": "https://x/a", "filename": "a.txt"}
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "reasoning", "text": "r", "provider": "anthropic", "signature": "sig"},
                {
                    "type": "tool-call",
                    "toolCallId": "s1",
                    "toolName": "web_search",
                    "input": {},
                    "provider": "openai",
                    "providerExecuted": True,
                },
            ],
        },
    ]
    req = ppb.ProcessLLMRequestRequest()
    convert.prompt_to_proto(prompt, req.prompt)
    assert convert.prompt_from_proto(req.prompt) == prompt

    # stored parts: the reference's providerMetadata comes back as the flat keys
    stored = {
        "id": "m1",
        "role": "assistant",
        "content": {
            "format": 2,
            "parts": [
                {"type": "reasoning", "text": "r", "providerMetadata": {"anthropic": {"signature": "sig"}}},
                {
                    "type": "tool-invocation",
                    "providerExecuted": True,
                    "providerMetadata": {"openai": {"itemId": "ws_1"}},
                    "toolInvocation": {
                        "state": "call",
                        "toolCallId": "s1",
                        "toolName": "web_search",
                        "args": {},
                    },
                },
            ],
        },
    }
    parts = convert.message_from_proto(convert.message_to_proto(stored))["content"]["parts"]
    assert parts == [
        {"type": "reasoning", "text": "r", "provider": "anthropic", "signature": "sig"},
        {
            "type": "tool-invocation",
            "toolInvocation": {"state": "call", "toolCallId": "s1", "toolName": "web_search", "args": {}},
            "provider": "openai",
            "providerExecuted": True,
        },
    ]


@PROPERTY
@given(
    st.integers(min_value=0, max_value=50),
    texts,
    st.lists(st.tuples(words, words, json_values), max_size=3),
    st.booleans(),
)
def test_step_round_trip(number: int, text: str, calls: list[tuple[str, str, Any]], tripped: bool) -> None:
    step: dict[str, Any] = {
        "stepNumber": number,
        "text": text,
        "toolCalls": [{"toolCallId": c, "toolName": n, "args": a} for c, n, a in calls],
        "toolResults": [{"toolCallId": c, "toolName": n, "args": a, "result": a} for c, n, a in calls],
        "finishReason": "tool-calls" if calls else "stop",
        "usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3},
        "tripwire": (
            {"processorId": "p", "reason": "r", "retry": True, "metadata": None} if tripped else None
        ),
    }
    out = pb.StepResult()
    convert.step_to_proto(step, out)
    assert_same(convert.step_from_proto(out), canonical(step))
