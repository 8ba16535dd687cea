"""The gateway's answer schema (`gateway_calls.schema_of`): checked, converted and its instruction made
once per schema, the same dict and instruction after; a schema that is no JSON schema refused every
time it is sent."""

from __future__ import annotations

import json

import grpc
import pytest

from procmesh import convert
from procmesh.v1 import model_pb2 as mpb
from procmesh_orchestrator.service.grpc import gateway_calls
from procmesh_orchestrator.service.grpc.judge_sections import Refused

VERDICT = {"type": "object", "properties": {"flagged": {"type": "boolean"}}, "required": ["flagged"]}


def _request(schema: dict[str, object]) -> mpb.ModelServiceGenerateRequest:
    request = mpb.ModelServiceGenerateRequest(
        model="judge", messages=[mpb.ModelMessage(role="user", text="hi")]
    )
    request.schema.CopyFrom(convert.to_struct(schema))
    return request


def test_a_schema_sent_again_is_the_same_checked_dict_and_instruction() -> None:
    gateway_calls._checked_schema.cache_clear()
    first = gateway_calls.schema_of(_request(VERDICT))
    again = gateway_calls.schema_of(_request(dict(reversed(list(VERDICT.items())))))  # another key order
    assert first is not None
    assert first.value == VERDICT
    assert again is first
    assert gateway_calls._checked_schema.cache_info().misses == 1
    text = first.instruction
    assert text == gateway_calls.instruction(first.value)
    assert text.endswith(json.dumps(first.value, ensure_ascii=False))
    assert again.instruction is text
    other = {"type": "object", "properties": {"score": {"type": "number"}}}
    assert gateway_calls.instruction(other).endswith(json.dumps(other))  # a dict of its own: its own text


def test_a_schema_that_is_no_json_schema_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(Refused) as refused:
            gateway_calls.schema_of(_request({"type": "no-such-type"}))
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert str(refused.value).startswith("schema: not a JSON schema")


def test_no_schema_is_none() -> None:
    request = mpb.ModelServiceGenerateRequest(model="judge")
    assert gateway_calls.schema_of(request) is None
