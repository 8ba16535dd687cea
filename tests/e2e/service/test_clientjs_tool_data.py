"""Tool data chunks and message metadata through HTTP and the real `@mastra/client-js`
(SEED-GAPS H6, H8): tests/clientjs/tool_data.mjs streams an agent whose scripted model calls a
Python hosted tool (tests/fixtures/data_sidecar.py), a Node one (tests/fixtures/node_data_tools.js)
and an MCP server's tool (tests/fixtures/mcp_server.py), each writing data chunks, and generates
with an agent whose ``stamp`` processor adds metadata in processOutputResult, which the client
reads as ``result.response.uiMessages[].metadata``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.e2e.node.conftest import node_sidecar, require_node
from tests.e2e.service.conftest import OrchestratorProcess, run_clientjs

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

CALLS = [
    {"name": "report", "args": {"rows": 2}},
    {"name": "tally", "args": {"items": ["a"]}},
    {"name": "progress", "args": {"steps": 2}},
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def out(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    require_node()
    python = start_sidecar(name="js-data", module="tests.fixtures.data_sidecar")
    folder = tmp_path_factory.mktemp("nodedata")
    node = node_sidecar(
        REPO / "tests" / "fixtures" / "node_data_tools.js", f"unix://{folder / 'n.sock'}", folder / "n.log"
    )
    try:
        await asyncio.gather(python.wait_ready(), node.wait_ready())
        server = [sys.executable, str(REPO / "tests" / "fixtures" / "mcp_server.py"), "--transport", "stdio"]
        config = {
            "sidecars": {"d": {"address": python.address}, "n": {"address": node.address}},
            "mcpServers": {"calc": {"command": server, "cwd": str(REPO)}},
            "tools": {"report": {"sidecar": "d"}, "tally": {"sidecar": "n"}, "progress": {"mcp": "calc"}},
            "models": {
                "tools": {"provider": "scripted", "responses": [{"toolCalls": CALLS}, {"text": "done"}]},
                "plain": {"provider": "scripted", "responses": [{"text": "hi there"}]},
            },
            "agents": {
                "tooled": {
                    "model": "tools",
                    "errorProcessorDefaults": False,
                    "tools": ["report", "tally", "progress"],
                },
                "stamped": {
                    "model": "plain",
                    "errorProcessorDefaults": False,
                    "outputProcessors": ["d/stamp"],
                },
            },
        }
        orchestrator = await asyncio.to_thread(start_orchestrator, config)
        result: dict[str, Any] = await asyncio.to_thread(run_clientjs, "tool_data.mjs", orchestrator)
        return result
    finally:
        node.stop(grace=2.0)


async def test_tool_data_chunks_reach_the_client_in_order(out: dict[str, Any]) -> None:
    rows = {"rows": [{"row": 1}, {"row": 2}], "note": "raw"}
    assert out["stream"] == [
        ["data-report", {"row": 1}],
        ["data-report", {"row": 2}],
        ["tool-result", "report", rows],
        ["data-tally", {"item": "a"}],
        ["tool-result", "tally", {"items": ["a"], "note": "raw"}],
        [
            "data-tool-progress",
            {"toolCallId": "call_3", "toolName": "progress", "progress": 1, "total": 2, "message": "step 1"},
        ],
        [
            "data-tool-progress",
            {"toolCallId": "call_3", "toolName": "progress", "progress": 2, "total": 2, "message": "step 2"},
        ],
        ["tool-result", "progress", {"result": "done"}],
    ]


async def test_generate_returns_ui_messages_with_the_processors_metadata(out: dict[str, Any]) -> None:
    assert out["customData"] == "stamped"
    (assistant,) = [m for m in out["uiMessages"] if m["role"] == "assistant"]
    assert assistant["metadata"]["by"] == "stamp"
    assert assistant["metadata"]["createdAt"]
    assert [p for p in assistant["parts"] if p["type"] == "text"] == [{"type": "text", "text": "hi there"}]
