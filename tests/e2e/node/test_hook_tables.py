"""The two SDKs' hook tables agree with each other and with the proto's `procmesh.v1.Hook` enum.

Each SDK derives its server, its processor base and Describe from its own table
(`procmesh.hooks.HOOKS`, `sdk/node/lib/hooks.js`); this test is what keeps the twins from drifting
when a hook or a hook argument is added to one of them.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

import pytest

from procmesh.hooks import HOOKS
from procmesh.v1 import processor_pb2 as ppb
from tests.conftest import NODE_SDK
from tests.e2e.node.conftest import require_node

pytestmark = pytest.mark.e2e

# Arguments only Node hooks receive: an AbortSignal for cancellation and deadlines (a Python hook
# sees the same as asyncio cancellation).
NODE_ONLY_ARGUMENTS = {"abort_signal"}
SERVICE = ppb.DESCRIPTOR.services_by_name["ProcessorService"]
ENUM = {value: name for name, value in ppb.Hook.items() if value != ppb.HOOK_UNSPECIFIED}


def snake(name: str) -> str:
    """`processLLMRequest` -> `process_llm_request` (an acronym stays one word)."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


@pytest.fixture(scope="module")
def node_hooks() -> list[dict[str, Any]]:
    """`require('sdk/node/lib/hooks.js').HOOKS`, printed as JSON by Node itself."""
    require_node()
    node = shutil.which("node")
    assert node is not None
    script = "process.stdout.write(JSON.stringify(require(process.argv[1])))"
    proc = subprocess.run(
        [node, "-e", script, str(NODE_SDK / "lib" / "hooks.js")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    table: list[dict[str, Any]] = json.loads(proc.stdout)["HOOKS"]
    return table


def test_snake_case_keeps_acronyms_whole() -> None:
    assert snake("processLLMRequest") == "process_llm_request"
    assert snake("processAPIError") == "process_api_error"
    assert snake("toolCallId") == "tool_call_id"


def test_both_tables_list_exactly_the_enum_in_its_order(node_hooks: list[dict[str, Any]]) -> None:
    assert [h.enum for h in HOOKS] == sorted(ENUM)
    assert [h["enum"] for h in node_hooks] == sorted(ENUM)
    assert [h["enumName"] for h in node_hooks] == [ENUM[value] for value in sorted(ENUM)]


def test_each_hook_has_the_same_rpc_messages_and_streaming_flag(node_hooks: list[dict[str, Any]]) -> None:
    for py, node in zip(HOOKS, node_hooks, strict=True):
        method = SERVICE.methods_by_name[py.rpc]
        assert node["rpc"] == py.rpc, py.name
        assert node["streaming"] is py.streaming, py.name
        assert method.client_streaming is method.server_streaming is py.streaming, py.name
        assert node["request"] == py.request.DESCRIPTOR.name == method.input_type.name, py.name
        assert node["response"] == py.response.DESCRIPTOR.name == method.output_type.name, py.name
    assert {h.rpc for h in HOOKS} == set(SERVICE.methods_by_name) - {"Describe"}


def test_python_names_are_the_snake_case_of_the_node_names(node_hooks: list[dict[str, Any]]) -> None:
    assert [snake(h["name"]) for h in node_hooks] == [h.name for h in HOOKS]


def test_both_sdks_hand_each_hook_the_same_arguments(node_hooks: list[dict[str, Any]]) -> None:
    for py, node in zip(HOOKS, node_hooks, strict=True):
        arguments = {snake(a) for a in node["arguments"]}
        assert arguments - NODE_ONLY_ARGUMENTS == set(py.arguments), py.name
        assert arguments >= NODE_ONLY_ARGUMENTS, py.name
