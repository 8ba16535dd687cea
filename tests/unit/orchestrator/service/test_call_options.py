"""The HTTP body and the gRPC request give the same call options: one conversion for both APIs."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import struct_pb2

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError, NotSupportedError
from procmesh_orchestrator.service._limits import InputLimits
from procmesh_orchestrator.service._trust import ContextTrust
from procmesh_orchestrator.service.api.calls import parse_body
from procmesh_orchestrator.service.grpc.requests import parse_proto

LIMITS = InputLimits()
CALLER = Caller("key-1", "user-1", frozenset())
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
    "structuredOutput": {"schema": SCHEMA, "errorStrategy": "fallback", "fallbackValue": {"city": "?"}},
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
    assert http.lanes == grpc.lanes == {"input": ["pii-redactor", "topic-guard"], "output": []}


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
