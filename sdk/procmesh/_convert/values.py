"""JSON values <-> ``google.protobuf.Value``/``Struct``: the layer every other mapping builds on."""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2

JSON = Any


def to_value(obj: JSON) -> struct_pb2.Value:
    """Convert a JSON-compatible Python value to ``google.protobuf.Value``."""
    value = struct_pb2.Value()
    _fill_value(value, obj)
    return value


def _fill_value(value: struct_pb2.Value, obj: JSON) -> None:
    if obj is None:
        value.null_value = struct_pb2.NULL_VALUE
    elif isinstance(obj, bool):
        value.bool_value = obj
    elif isinstance(obj, int | float):
        value.number_value = obj
    elif isinstance(obj, str):
        value.string_value = obj
    elif isinstance(obj, dict):
        # SetInParent: an empty {} or [] must still select its kind, or it reads back as null.
        value.struct_value.SetInParent()
        fill_struct(value.struct_value, obj)
    elif isinstance(obj, list | tuple):
        lst = value.list_value
        lst.SetInParent()
        for item in obj:
            _fill_value(lst.values.add(), item)
    else:
        raise TypeError(f"value of type {type(obj).__name__} is not JSON-serializable")


def fill_struct(struct: struct_pb2.Struct, obj: dict[str, Any]) -> None:
    """Fill an existing ``Struct`` (a message field) in place from a dict."""
    for key, item in obj.items():
        if not isinstance(key, str):
            raise TypeError(f"JSON object keys must be strings, got {type(key).__name__}")
        _fill_value(struct.fields[key], item)


def to_struct(obj: dict[str, Any] | None) -> struct_pb2.Struct:
    """Convert a dict to ``google.protobuf.Struct`` (None gives an empty Struct)."""
    struct = struct_pb2.Struct()
    if obj:
        fill_struct(struct, obj)
    return struct


def from_value(value: struct_pb2.Value) -> JSON:
    """Convert ``google.protobuf.Value`` to Python; integral numbers become ints (as in JSON)."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        num = value.number_value
        return int(num) if num.is_integer() and abs(num) < 2**53 else num
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return from_struct(value.struct_value)
    if kind == "list_value":
        return [from_value(v) for v in value.list_value.values]
    return None


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """Convert ``google.protobuf.Struct`` to a dict."""
    return {key: from_value(val) for key, val in struct.fields.items()}
