"""The HTTP body and the gRPC request give the same call options: one conversion for both APIs;
and what a body may name depends on its key: a resource and thread only the key's own (an operator
names the one it acts for), a message's id only from an operator, its thread and resource never."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import AgentSpec, CallOptions, snapshot
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError, NotSupportedError
from procmesh_orchestrator.service._limits import InputLimits
from procmesh_orchestrator.service._trust import ContextTrust
from procmesh_orchestrator.service.api.calls import parse_body
from procmesh_orchestrator.service.grpc.requests import parse_proto

LIMITS = InputLimits()
CALLER = Caller("key-1", "user-1", frozenset())
OPERATOR = Caller("key-1", None, frozenset({"operator"}))
TRUST = ContextTrust.of({}, [CALLER], legacy=False)
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def _struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


BODY = {
    "messages": "hi",
    "instructions": "Be short.",
    "system": ["Answer in English.", {"role": "system", "content": "No emoji."}],
    "modelSettings": {
        "temperature": 0.5,
        "maxOutputTokens": 100,
        "topP": 0.9,
        "stopSequences": ["END"],
        "seed": 7,
    },
    "toolChoice": {"type": "tool", "toolName": "weather"},
    "activeTools": ["weather"],
    "structuredOutput": {
        "schema": SCHEMA,
        "errorStrategy": "fallback",
        "fallbackValue": {"city": "?"},
        "jsonPromptInjection": True,
    },
    "inputProcessors": ["pii-redactor", {"id": "topic-guard", "name": "mine"}],
    "outputProcessors": [],
}
REQUEST = apb.GenerateRequest(
    agent_id="a",
    text="hi",
    instructions="Be short.",
    system=["Answer in English.", "No emoji."],
    model_settings=apb.ModelSettings(
        temperature=0.5, max_output_tokens=100, top_p=0.9, stop_sequences=["END"], seed=7
    ),
    tool_choice=tpb.ToolChoice(mode="tool", tool_name="weather"),
    active_tools=apb.ToolNames(names=["weather"]),
    structured_output=apb.StructuredOutput(
        schema=_struct(SCHEMA),
        error_strategy="fallback",
        fallback_value=struct_pb2.Value(struct_value=_struct({"city": "?"})),
        json_prompt_injection=True,
    ),
    input_processors=apb.ProcessorList(ids=["pii-redactor", "topic-guard"]),
    output_processors=apb.ProcessorList(),
)
STEP_FIELDS = ("instructions", "system", "model_settings", "tool_choice", "active_tools", "structured_output")


def test_both_apis_give_the_same_options() -> None:
    http = parse_body(BODY, caller=CALLER, trust=TRUST, limits=LIMITS)
    grpc = parse_proto(REQUEST, caller=CALLER, trust=TRUST, timeout=None, limits=LIMITS)
    for name in STEP_FIELDS:
        assert getattr(http.options, name) == getattr(grpc.options, name), name
    assert http.options.model_settings == {
        "temperature": 0.5,
        "maxOutputTokens": 100,
        "topP": 0.9,
        "stopSequences": ["END"],
        "seed": 7,
    }
    assert list(http.options.system) == ["Answer in English.", "No emoji."]
    assert http.options.structured_output is not None
    assert http.options.structured_output.json_prompt_injection is True
    assert http.lanes == grpc.lanes == {"input": ["pii-redactor", "topic-guard"], "output": []}


def test_a_durable_or_resumed_run_keeps_the_structured_output_whole() -> None:
    # the snapshot's copy of the call: without jsonPromptInjection a resumed run would send the
    # native response format the caller turned off
    body = {k: v for k, v in BODY.items() if not k.endswith("Processors")}  # lists need a binder
    options = parse_body(body, caller=CALLER, trust=TRUST, limits=LIMITS).options
    agent = AgentSpec("a", ScriptedModel([]), lambda *_: None)
    resumed = snapshot.resumed_options(snapshot.call_data(options), CallOptions(), agent)
    assert resumed.structured_output == options.structured_output


def test_memory_read_only_is_the_options_unless_they_say() -> None:
    def read_only(memory: dict[str, Any]) -> bool | None:
        body = {"messages": "hi", "memory": {"thread": "t", "resource": "r", **memory}}
        return parse_body(body, caller=OPERATOR, trust=TRUST, limits=LIMITS).options.memory.read_only

    assert read_only({"readOnly": True}) is True
    assert read_only({"readOnly": True, "options": {"readOnly": False}}) is False
    assert read_only({}) is None
    with pytest.raises(BadRequestError, match=r"memory\.title: Extra inputs are not permitted"):
        read_only({"title": "x"})


def test_a_thread_objects_title_and_metadata_are_warned_of_never_dropped_silently() -> None:
    thread = {"id": "t", "title": "Trip", "metadata": {"a": 1}, "colour": "red"}
    body = {"messages": "hi", "memory": {"thread": thread, "resource": "r"}}
    call = parse_body(body, caller=OPERATOR, trust=TRUST, limits=LIMITS)
    assert call.options.thread_id == "t"
    assert [w["setting"] for w in call.warnings] == [
        "memory.thread.colour",
        "memory.thread.metadata",
        "memory.thread.title",
    ]
    assert call.ignored_labels == ["other", "memory.thread.metadata", "memory.thread.title"]


def test_unset_options_are_the_agents() -> None:
    http = parse_body({"messages": "hi"}, caller=CALLER, trust=TRUST, limits=LIMITS)
    grpc = parse_proto(
        apb.GenerateRequest(agent_id="a", text="hi"), caller=CALLER, trust=TRUST, timeout=None, limits=LIMITS
    )
    for call in (http, grpc):
        assert [getattr(call.options, n) for n in STEP_FIELDS] == [None, (), None, None, None, None]
        assert call.lanes == {}


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        ({"inputProcessors": [7]}, BadRequestError, "inputProcessors.0: must be a processor id"),
        (
            {"errorProcessors": [{"processAPIError": None}]},
            NotSupportedError,
            "errorProcessors.0: processors defined in the caller's code",
        ),
        (
            {"outputProcessors": "word-filter"},
            BadRequestError,
            "outputProcessors: Input should be a valid list",
        ),
    ],
)
def test_a_lane_entry_that_names_no_processor_is_refused(
    body: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        parse_body({"messages": "hi", **body}, caller=CALLER, trust=TRUST, limits=LIMITS)


def test_the_resource_is_the_keys_and_an_operator_names_the_one_it_acts_for() -> None:
    body = {"messages": "hi", "resourceId": "org-7", "threadId": "t-1"}
    trust = ContextTrust.of({}, [], legacy=False)
    gateway = Caller("key-3", None, frozenset({"gateway"}))
    # a key with no resource of its own cannot name one: its thread is refused, never dropped
    with pytest.raises(BadRequestError, match="threadId: a thread belongs to a resource"):
        parse_body(body, caller=gateway, trust=trust, limits=LIMITS)
    nothing = parse_body(
        {"messages": "hi", "resourceId": "org-7"}, caller=gateway, trust=trust, limits=LIMITS
    )
    assert (nothing.options.resource_id, nothing.options.thread_id) == ("", "")
    acting = parse_body(body, caller=OPERATOR, trust=trust, limits=LIMITS)
    assert (acting.options.resource_id, acting.options.thread_id) == ("org-7", "t-1")
    tenant = Caller("key-2", "org-7", frozenset())
    own = parse_body({"messages": "hi", "threadId": "t-1"}, caller=tenant, trust=trust, limits=LIMITS)
    assert (own.options.resource_id, own.options.thread_id) == ("org-7", "t-1")
    with pytest.raises(BadRequestError, match="bound to another resource"):
        parse_body({**body, "resourceId": "org-8"}, caller=tenant, trust=trust, limits=LIMITS)


def test_a_message_never_names_its_thread_or_resource_and_only_an_operator_keeps_its_id() -> None:
    message = {
        "id": "forged-id",
        "role": "user",
        "threadId": "someone-elses-thread",
        "resourceId": "someone-else",
        "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}]},
    }
    trust = ContextTrust.of({}, [], legacy=False)
    tenant = Caller("key-2", "org-7", frozenset())
    untrusted = parse_body({"messages": [message]}, caller=tenant, trust=trust, limits=LIMITS)
    (seen,) = untrusted.input
    assert isinstance(seen, dict)
    assert seen["id"] != "forged-id"
    assert "threadId" not in seen
    assert "resourceId" not in seen
    trusted = parse_body({"messages": [message]}, caller=OPERATOR, trust=trust, limits=LIMITS)
    (kept,) = trusted.input
    assert isinstance(kept, dict)
    assert kept["id"] == "forged-id"
    assert "threadId" not in kept
    assert "resourceId" not in kept
