"""A hook's response that sets a result field without the flag it is read under is malformed
(`wire.check_flags`), and so is a stream result with ``extra_parts`` and no ``part``
(`check_extras`): the orchestrator would go on without them, silently. The failure policy then
decides (tests/e2e/test_failure_policy.py, cases ``unflagged`` and ``extras-only``, through a real
sidecar)."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh import convert
from procmesh.hooks import BY_NAME
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError
from procmesh_orchestrator.processors import wire
from procmesh_orchestrator.processors.stream_call import check_extras


def _message(response: Any, field: str) -> None:
    convert.message_to_proto(
        {"id": "m1", "role": "user", "content": {"format": 2, "parts": []}}, getattr(response, field).add()
    )


def _set(response: Any, field: str) -> None:
    value = getattr(response, field)
    if field in ("messages", "system_messages", "all_messages"):
        _message(response, field)
    elif field == "prompt":
        value.add(role="user")
    elif field == "tools":
        value.add(name="t")
    elif field == "active_tools":
        value.append("t")
    elif field == "cached_response":
        value.add(type="text-delta")
    elif field == "cached_tool_results":
        value.add(tool_call_id="c1", tool_name="t")
    else:
        assert field == "result", field
        value.CopyFrom(convert.to_value({"ok": True}))


PAIRS = [
    (hook, flag, field) for hook in wire.WIRE for flag, fields in wire._FLAGGED[hook] for field, _ in fields
]


def test_every_flagged_field_of_every_hook_is_checked() -> None:
    assert {(hook, field) for hook, _, field in PAIRS} == {
        ("process_input", "messages"),
        ("process_input", "system_messages"),
        ("process_input", "all_messages"),
        ("process_input_step", "messages"),
        ("process_input_step", "system_messages"),
        ("process_input_step", "tools"),
        ("process_input_step", "active_tools"),
        ("process_llm_request", "prompt"),
        ("process_llm_request", "cached_response"),
        ("process_llm_request", "cached_tool_results"),
        ("process_output_step", "messages"),
        ("process_tool_result", "result"),
        ("process_output_result", "messages"),
        ("process_api_error", "messages"),
    }


@pytest.mark.parametrize(("hook", "flag", "field"), PAIRS)
def test_a_field_without_its_flag_is_malformed_naming_both(hook: str, flag: str, field: str) -> None:
    response = BY_NAME[hook].response()
    _set(response, field)
    with pytest.raises(MalformedResponseError, match=f"^{field} is set but {flag} is false"):
        wire.check_flags(hook, response)
    setattr(response, flag, True)
    wire.check_flags(hook, response)  # with its flag: read


@pytest.mark.parametrize("hook", list(wire.WIRE))
def test_an_empty_answer_and_a_flag_with_an_empty_field_are_well_formed(hook: str) -> None:
    wire.check_flags(hook, BY_NAME[hook].response())
    response = BY_NAME[hook].response()
    for flag, _ in wire._FLAGGED[hook]:
        setattr(response, flag, True)  # an empty replacement is one (no tools, no messages)
    wire.check_flags(hook, response)


@pytest.mark.parametrize("mode", ["", "auto", "required", "none"])
def test_a_tool_choice_naming_a_tool_without_mode_tool_is_malformed(mode: str) -> None:
    response = BY_NAME["process_input_step"].response(tool_choice=tpb.ToolChoice(mode=mode, tool_name="t"))
    with pytest.raises(MalformedResponseError, match=r"tool_choice\.tool_name is set but tool_choice\.mode"):
        wire.check_flags("process_input_step", response)
    response.tool_choice.mode = "tool"
    wire.check_flags("process_input_step", response)


def test_a_stream_result_with_extra_parts_and_no_part_is_malformed() -> None:
    extras_only = ppb.StreamPartResult(seq=3, extra_parts=[tpb.Chunk(type="text-delta")])
    with pytest.raises(MalformedResponseError, match="result for part 3 has 1 extra_parts but no part"):
        check_extras(extras_only)
    check_extras(ppb.StreamPartResult(seq=3))  # dropped
    check_extras(ppb.StreamPartResult(seq=3, part=tpb.Chunk(type="text-delta"), extra_parts=[tpb.Chunk()]))


VALUE = convert.to_value({"ok": True})


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"result": VALUE, "error": "e"}, "result set beside error"),
        ({"model_output": VALUE, "error": "e"}, "model_output set beside error"),
        ({"suspend_payload": VALUE, "result": VALUE}, "result set beside suspend_payload"),
        ({"suspend_payload": VALUE, "error": "e"}, "error set beside suspend_payload"),
        ({"resume_schema": "{}"}, "resume_schema set without suspend_payload"),
    ],
)
def test_a_tool_answer_holding_two_answers_is_malformed(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(MalformedResponseError, match=f"^{named}"):
        wire.check_flags("execute_tool", ppb.ExecuteToolResponse(**fields))


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"result": VALUE},
        {"result": VALUE, "model_output": VALUE},
        {"error": "e"},
        {"suspend_payload": VALUE, "resume_schema": "{}"},
    ],
)
def test_a_tool_answer_of_one_kind_is_well_formed(fields: dict[str, Any]) -> None:
    wire.check_flags("execute_tool", ppb.ExecuteToolResponse(**fields))
