"""The docs name only proto fields that exist: every ``Message.field`` in backticks whose
``Message`` is a message of proto/procmesh/v1 names one of its fields, oneofs or nested enum
values (proto/README.md documents the wire by such names, and a renamed field would leave it
telling authors in other languages to read what no longer comes).

The truth is the generated descriptors (sdk/procmesh/v1, checked against the .proto files by
`make proto-check`); `test_the_check_catches_made_up_fields` feeds it a made-up document.
"""

from __future__ import annotations

import re
from pathlib import Path

from google.protobuf.descriptor import Descriptor

from procmesh.v1 import agent_pb2, model_pb2, processor_pb2, types_pb2
from tests.conftest import REPO
from tests.unit.test_docs import DOCS, Doc, _rel


def _members(message: Descriptor) -> set[str]:
    """What `Message.name` may name: its fields, its oneofs and its nested enums' values."""
    names = {f.name for f in message.fields} | {o.name for o in message.oneofs}
    return names | {v.name for enum in message.enum_types for v in enum.values}


def proto_messages() -> dict[str, set[str]]:
    """Each message of the contract, nested ones too, by its short name: what it holds (two
    nested messages of one short name pool their members: the docs name them by short name)."""
    found: dict[str, set[str]] = {}
    todo = [
        m
        for module in (agent_pb2, model_pb2, processor_pb2, types_pb2)
        for m in module.DESCRIPTOR.message_types_by_name.values()
    ]
    while todo:
        message = todo.pop()
        found.setdefault(message.name, set()).update(_members(message))
        todo.extend(message.nested_types)
    return found


def field_problems(doc: Doc, messages: dict[str, set[str]]) -> list[str]:
    """Every `Message.field` span naming a message of the contract names one of its members."""
    problems = []
    for span in doc.spans:
        match = re.fullmatch(r"([A-Z]\w*)\.([a-z_]\w*)", span)
        if match and match[1] in messages and match[2] not in messages[match[1]]:
            problems.append(f"{_rel(doc.path)}: {span}: {match[1]} has no field {match[2]}")
    return problems


def test_proto_fields_named_in_the_docs_exist() -> None:
    messages = proto_messages()
    assert {"Part", "StreamEnd", "RunContext"} <= set(messages)  # the contract was read
    docs = [Doc.parse(path) for path in DOCS]
    named = [s for doc in docs for s in doc.spans if re.fullmatch(r"([A-Z]\w*)\.[a-z_]\w*", s)]
    assert sum(s.split(".")[0] in messages for s in named) >= 20  # the docs name fields this way
    assert [p for doc in docs for p in field_problems(doc, messages)] == []


def test_the_check_catches_made_up_fields() -> None:
    fake = Doc.parse(
        Path(REPO / "docs" / "made-up.md"),
        "`StreamEnd.state` and `StreamEnd.states`; `RunContext.request_context`, "
        "`ToolChoice.mode`, `Part.kind` (a oneof) and `CallOptions.nothing` (no proto message).\n",
    )
    assert field_problems(fake, proto_messages()) == [
        "docs/made-up.md: StreamEnd.states: StreamEnd has no field states"
    ]
