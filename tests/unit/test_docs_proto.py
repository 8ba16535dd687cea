"""The docs name only proto fields that exist: every ``Message.field`` in backticks whose
``Message`` is a message of proto/procmesh/v1 names one of its fields, oneofs or nested enum
values (proto/README.md documents the wire by such names, and a renamed field would leave it
telling authors in other languages to read what no longer comes), and so does every field a
`Message{a, b}` or `RunRecord {run_id, ...}` list names (`test_the_brace_check_catches_made_up_fields`).

The truth is the generated descriptors (sdk/procmesh/v1, checked against the .proto files by
`make proto-check`); `test_the_check_catches_made_up_fields` feeds it a made-up document.
Every "has N RPCs" (and the list after it) is checked against the .proto files' services
(`test_rpc_counts_match_the_protos`), and proto/README.md's RPCs table and the RPCs it names against
them too (`test_the_contract_page_lists_every_rpc`); each hook's section names every field of its
request and response (`test_each_hooks_section_names_its_fields`).
"""

from __future__ import annotations

import re

from google.protobuf.descriptor import Descriptor

from procmesh.v1 import agent_pb2, model_pb2, processor_pb2, types_pb2
from tests.conftest import REPO
from tests.unit.doc_pages import DOCS, Doc, _rel, made_up


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


def _closing(text: str, start: int) -> int:
    """The index of the brace that closes the one at `start` (-1: none)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return -1


def brace_field_problems(doc: Doc, messages: dict[str, set[str]]) -> tuple[int, list[str]]:
    """Every field a `Message{a, b}` / `Message {a, b, ...}` list names (snake_case, its
    parenthesized notes and nested braces aside) is one of that message's: how many were named,
    and the ones it lacks."""
    text = " ".join(doc.text.split())
    named, problems = 0, []
    for match in re.finditer(r"\b([A-Z]\w*) ?\{", text):
        if match[1] not in messages:
            continue
        body = text[match.end() : _closing(text, match.end() - 1)]
        while re.search(r"\([^()]*\)|\{[^{}]*\}", body):
            body = re.sub(r"\([^()]*\)|\{[^{}]*\}", "", body)
        for item in body.split(","):
            word = item.strip().strip("`").split(" ")[0].split(":")[0]
            if re.fullmatch(r"[a-z_][a-z0-9_]*", word):
                named += 1
                if word not in messages[match[1]]:
                    problems.append(f"{_rel(doc.path)}: {match[1]}{{{word}}}: {match[1]} has no field {word}")
    return named, problems


def test_proto_fields_named_in_the_docs_exist() -> None:
    messages = proto_messages()
    assert {"Part", "StreamEnd", "RunContext"} <= set(messages)  # the contract was read
    docs = [Doc.parse(path) for path in DOCS]
    named = [s for doc in docs for s in doc.spans if re.fullmatch(r"([A-Z]\w*)\.[a-z_]\w*", s)]
    assert sum(s.split(".")[0] in messages for s in named) >= 20  # the docs name fields this way
    assert [p for doc in docs for p in field_problems(doc, messages)] == []
    braced = [brace_field_problems(doc, messages) for doc in docs]
    assert sum(named for named, _ in braced) >= 50  # `RunRecord {run_id, ...}` lists were read
    assert [p for _, problems in braced for p in problems] == []


def test_the_brace_check_catches_made_up_fields() -> None:
    fake = made_up(
        "`StreamEnd{state}`, `ObserveRequest {run_id, offsett}`, `RunDecision {agent_id, part (unset: a\n"
        "unary hook), colour, ...}`, `MemoryOptions {message_history {max_tokens}, read_only}` and\n"
        "`Unknown{x}` (no message).\n",
    )
    assert brace_field_problems(fake, proto_messages()) == (
        8,
        [
            "docs/made-up.md: ObserveRequest{offsett}: ObserveRequest has no field offsett",
            "docs/made-up.md: RunDecision{colour}: RunDecision has no field colour",
        ],
    )


def test_the_check_catches_made_up_fields() -> None:
    fake = made_up(
        "`StreamEnd.state` and `StreamEnd.states`; `RunContext.request_context`, "
        "`ToolChoice.mode`, `Part.kind` (a oneof) and `CallOptions.nothing` (no proto message).\n",
    )
    assert field_problems(fake, proto_messages()) == [
        "docs/made-up.md: StreamEnd.states: StreamEnd has no field states"
    ]


# -- RPC counts ----------------------------------------------------------------------------------

NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
"""Counts the docs may spell out."""


def proto_services() -> dict[str, tuple[str, list[str]]]:
    """Each service of proto/procmesh/v1: its file name and its RPCs' names, in order."""
    services = {}
    for path in sorted((REPO / "proto" / "procmesh" / "v1").glob("*.proto")):
        text = path.read_text(encoding="utf-8")
        for name, body in re.findall(r"^service (\w+) \{(.*?)^\}", text, flags=re.M | re.S):
            services[name] = (path.name, re.findall(r"^\s*rpc (\w+)\(", body, flags=re.M))
    return services


def rpc_count_problems(doc: Doc, services: dict[str, tuple[str, list[str]]]) -> list[str]:
    """Every "has N RPCs" names the count of the service the text before it last named (by its
    name or its .proto file), and every RPC listed after it in backticks is one of that service's."""
    problems = []
    for match in re.finditer(r"\bhas (\d+|[a-z]+) RPCs\b(:[^.]*)?", doc.text):
        before = doc.text[: match.start()]
        named = [
            (before.rfind(key), service) for service, (file, _) in services.items() for key in (service, file)
        ]
        where, service = max(named)
        if where < 0:
            problems.append(f"{_rel(doc.path)}: '{match[0][:40]}' names no service before it")
            continue
        rpcs = services[service][1]
        said = int(match[1]) if match[1].isdigit() else NUMBERS.get(match[1], -1)
        if said != len(rpcs):
            problems.append(f"{_rel(doc.path)}: {service} has {len(rpcs)} RPCs, not {match[1]}")
        listed = re.findall(r"`(\w+)`", match[2] or "")
        problems += [f"{_rel(doc.path)}: {service} has no RPC {name}" for name in listed if name not in rpcs]
        if listed:  # a list after the count is the whole list
            problems += [
                f"{_rel(doc.path)}: {service}'s list lacks {name}" for name in rpcs if name not in listed
            ]
    return problems


def contract_page_problems(text: str, services: dict[str, tuple[str, list[str]]]) -> list[str]:
    """proto/README.md's "## RPCs" table has a row for each ProcessorService RPC but `Describe`
    (its own section) and no other, and the page names every RPC of every service."""
    section = text.split("\n## RPCs\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \|", section, flags=re.M)
    want = [rpc for rpc in services["ProcessorService"][1] if rpc != "Describe"]
    problems = [f"proto/README.md: the RPCs table lacks {rpc}" for rpc in want if rpc not in rows]
    problems += [
        f"proto/README.md: the RPCs table's {rpc} is no ProcessorService RPC"
        for rpc in rows
        if rpc not in want
    ]
    return problems + [
        f"proto/README.md: {service}'s {rpc} is named nowhere"
        for service, (_, rpcs) in services.items()
        for rpc in rpcs
        if f"`{rpc}" not in text
    ]


def test_rpc_counts_match_the_protos(docs: list[Doc]) -> None:
    services = proto_services()
    assert len(services["AgentService"][1]) >= 8  # the parse found them
    assert [p for doc in docs for p in rpc_count_problems(doc, services)] == []
    said = [doc for doc in docs if re.search(r"AgentService.{0,80}has \d+ RPCs", doc.text, flags=re.S)]
    assert said, "docs/service.md says how many RPCs AgentService has"


def test_the_contract_page_lists_every_rpc() -> None:
    services = proto_services()
    assert {"ProcessorService", "AgentService", "ModelService"} <= set(services)
    assert contract_page_problems((REPO / "proto" / "README.md").read_text(encoding="utf-8"), services) == []


def test_the_rpc_count_check_catches_made_up_claims() -> None:
    services = proto_services()
    fake = made_up(
        "`procmesh.v1.AgentService` has two RPCs: `Generate` and `Frobnicate`.\n",
    )
    assert rpc_count_problems(fake, services)[:3] == [
        f"docs/made-up.md: AgentService has {len(services['AgentService'][1])} RPCs, not two",
        "docs/made-up.md: AgentService has no RPC Frobnicate",
        f"docs/made-up.md: AgentService's list lacks {services['AgentService'][1][1]}",
    ]
    page = "# Contract\n\n## RPCs\n\n| RPC | called |\n|---|---|\n| `ProcessInput` | once |\n"
    page += "| `ProcessFrob` | never |\n\n## Next\n"
    problems = contract_page_problems(page, services)
    assert problems[:2] == [
        "proto/README.md: the RPCs table lacks ProcessInputStep",
        "proto/README.md: the RPCs table lacks ProcessLLMRequest",
    ]
    assert "proto/README.md: the RPCs table's ProcessFrob is no ProcessorService RPC" in problems
    assert "proto/README.md: ModelService's ReportSaved is named nowhere" in problems


# -- each hook's fields --------------------------------------------------------------------------


def hook_field_problems(text: str) -> list[str]:
    """proto/README.md's section of each ProcessorService RPC (`### ProcessInput`) names every
    field of its request before "Response" and every field of its response after it (`context`
    and `effects` have sections of their own)."""
    problems = []
    for rpc, body in re.findall(r"^### (\w+)\n(.*?)(?=^##)", text, flags=re.M | re.S):
        request = getattr(processor_pb2, f"{rpc}Request", None)
        if request is None or "Request fields" not in body:
            continue
        asked, _, answered = body.split("Request fields", 1)[1].partition("Response")
        response = getattr(processor_pb2, f"{rpc}Response")
        for part, message in ((asked, request), (answered, response)):
            said = set(re.findall(r"`(\w+)`", part))
            problems += [
                f"proto/README.md: {rpc}: {message.DESCRIPTOR.name}.{field.name} is not described"
                for field in message.DESCRIPTOR.fields
                if field.name not in said | {"context", "effects"}
            ]
    return problems


def test_each_hooks_section_names_its_fields() -> None:
    text = (REPO / "proto" / "README.md").read_text(encoding="utf-8")
    assert (
        len(re.findall(r"^### (?:Process\w+|ExecuteTool)\n", text, flags=re.M)) >= 9
    )  # the sections were found
    assert hook_field_problems(text) == []
    made_up = (
        "### ProcessToolResult\n\nRequest fields: `messages`, `result`.\n\nResponse: `result`.\n\n## Next\n"
    )
    assert hook_field_problems(made_up)[:2] == [
        "proto/README.md: ProcessToolResult: ProcessToolResultRequest.tool_name is not described",
        "proto/README.md: ProcessToolResult: ProcessToolResultRequest.tool_call_id is not described",
    ]
    assert (
        "proto/README.md: ProcessToolResult: ProcessToolResultResponse.replace_result is not described"
        in (hook_field_problems(made_up))
    )
