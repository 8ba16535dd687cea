"""known_fields: a request's unknown fields found and named, wherever they are, and none when
there are none (the quick size check agrees with the walk)."""

from __future__ import annotations

from google.protobuf.internal.encoder import _VarintBytes

from procmesh import convert
from procmesh.v1 import model_pb2 as mpb
from procmesh_orchestrator.service.grpc.known_fields import unknown_fields, unknown_fields_of


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _VarintBytes((number << 3) | 2) + _VarintBytes(len(payload)) + payload


_UNKNOWN = _VarintBytes(99 << 3) + b"\x05"  # field 99, a varint


def _question() -> mpb.ModelServiceGenerateRequest:
    request = mpb.ModelServiceGenerateRequest(
        model="judges/in",
        processor_id="moderation",
        messages=[mpb.ModelMessage(role="user", text='Content: "hello"')],
    )
    schema = {"type": "object", "properties": {"flagged": {"type": "boolean"}}, "required": ["flagged"]}
    request.schema.CopyFrom(convert.to_struct(schema))
    request.section.CopyFrom(mpb.JudgeSection(content="hello", question="flagged?", phase="input"))
    return request


def _decode(raw: bytes) -> mpb.ModelServiceGenerateRequest:
    return mpb.ModelServiceGenerateRequest.FromString(raw)


def test_a_request_without_unknown_fields_has_none_and_is_left_as_it_was() -> None:
    raw = _question().SerializeToString()
    request = _decode(raw)
    assert unknown_fields_of(request, raw, _decode) == []
    assert request == _decode(raw)


def test_unknown_fields_at_any_depth_are_named_as_the_walk_names_them() -> None:
    base = _question().SerializeToString()
    message = mpb.ModelMessage(role="user", text="x").SerializeToString() + _UNKNOWN
    value = convert.to_value("v").SerializeToString() + _UNKNOWN
    # schema (field 3) .fields["k"] (a map of messages) = a Value holding field 99
    struct = _field(1, _field(1, b"k") + _field(2, value))
    for raw, named in (
        (base + _UNKNOWN, ["field 99"]),
        (base + _field(2, message), ["messages.1: field 99"]),
        (base + _field(3, struct), ["schema.fields.k: field 99"]),
    ):
        assert unknown_fields(_decode(raw)) == named, named
        assert unknown_fields_of(_decode(raw), raw, _decode) == named, named
