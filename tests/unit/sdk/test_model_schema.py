"""The gateway client's schema Struct (`procmesh._model._schema_struct`): built once per schema
content, however many questions carry it, and always the schema as given at the call."""

from __future__ import annotations

from typing import Any

from procmesh import _model, convert


def _schema(categories: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"category": {"enum": categories}, "score": {"type": "number", "maximum": 1}},
        "required": ["category", "score"],
    }


def test_a_schema_rebuilt_per_question_is_converted_once() -> None:
    _model._struct_of.cache_clear()
    structs = [_model._schema_struct(_schema(["hate", "violence"])) for _ in range(19)]
    assert all(s == convert.to_struct(_schema(["hate", "violence"])) for s in structs)
    info = _model._struct_of.cache_info()
    assert (info.misses, info.hits) == (1, 18)


def test_a_changed_schema_is_a_new_struct_even_as_the_same_object() -> None:
    schema = _schema(["hate"])
    first = _model._schema_struct(schema)
    schema["properties"]["category"]["enum"].append("violence")  # the caller changed it in place
    second = _model._schema_struct(schema)
    assert convert.from_struct(first)["properties"]["category"]["enum"] == ["hate"]
    assert convert.from_struct(second)["properties"]["category"]["enum"] == ["hate", "violence"]


def test_a_schema_that_is_not_json_text_is_still_sent() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "number", "maximum": float("inf")}}}
    assert _model._schema_struct(schema) == convert.to_struct(schema)
