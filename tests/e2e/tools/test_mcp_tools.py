"""An agent's tools from an MCP server (tests/fixtures/mcp_server.py), a real process the App starts
over stdio (``command``) or reaches over streamable HTTP (``url``).

The scripted model calls ``add`` and ``lookup``; the result (or the server's isError answer) is in
the model's next prompt; an agent's ``mcpServers: [name]`` offers every tool the server lists.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config
from tests.conftest import REPO
from tests.e2e.tools.harness import call, collect, config, of_type, offered, prompts, tool_outputs
from tests.integration.test_mcp import SERVER, HttpServer, _free_port

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

DONE = {"text": "all done"}


@pytest.fixture(scope="module")
def http_mcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The fixture server over streamable HTTP, once for the module: its URL."""
    server = HttpServer(_free_port(), tmp_path_factory.mktemp("mcp-http") / "events")
    server.start()
    yield server.url
    server.stop()


def stdio() -> dict[str, Any]:
    return {"command": [sys.executable, str(SERVER), "--transport", "stdio"], "cwd": str(REPO)}


@pytest.fixture(params=["stdio", "http"])
def server(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The `mcpServers` entry of the fixture server on one transport."""
    if request.param == "stdio":
        return stdio()
    return {"url": request.getfixturevalue("http_mcp")}


def mcp_config(server: dict[str, Any], responses: list[dict[str, Any]], **agent: Any) -> Config:
    return config(
        top={"mcpServers": {"calc": server}},
        tools={"add": {"mcp": "calc"}, "lookup": {"mcp": "calc"}},
        responses=responses,
        **agent,
    )


async def test_the_model_calls_add_and_reads_the_sum(server: dict[str, Any]) -> None:
    async with App(mcp_config(server, [{"toolCalls": [call("add", a=2, b=3.5)]}, DONE])) as app:
        chunks, result = await collect(app)
        sent = prompts(app)
    assert result.status == "success", result.error
    assert result.text == "all done"
    assert [r["result"] for r in of_type(chunks, "tool-result")] == [{"result": 5.5}]
    assert tool_outputs(sent[1]) == {"call_1": {"result": 5.5}}
    tools = offered(app)
    assert set(tools) == {"add", "lookup"}
    assert tools["add"]["description"] == "Add two numbers."  # from the server's tools/list
    assert set(tools["add"]["inputSchema"]["properties"]) == {"a", "b"}


async def test_an_unknown_key_is_a_tool_error_the_model_reads(server: dict[str, Any]) -> None:
    responses: list[dict[str, Any]] = [
        {"toolCalls": [call("lookup", key="nope"), call("lookup", key="alpha")]},
        DONE,
    ]
    async with App(mcp_config(server, responses)) as app:
        chunks, result = await collect(app)
        sent = prompts(app)
    assert result.status == "success", result.error
    (error,) = of_type(chunks, "tool-error")
    assert error["toolCallId"] == "call_1"
    assert "no such key: nope" in error["error"]
    assert [r["result"] for r in of_type(chunks, "tool-result")] == [{"result": "first"}]
    outputs = tool_outputs(sent[1])
    assert "no such key: nope" in str(outputs["call_1"])
    assert outputs["call_2"] == {"result": "first"}


async def test_an_agent_with_mcp_servers_takes_every_tool() -> None:
    cfg = config(
        top={"mcpServers": {"calc": stdio()}},
        mcpServers=["calc"],
        responses=[{"toolCalls": [call("add", a=1, b=1), call("lookup", key="beta")]}, DONE],
    )
    async with App(cfg) as app:
        chunks, result = await collect(app)
        names = sorted(offered(app))
    assert names == ["add", "context", "crash", "lookup", "progress", "slow"]
    assert result.status == "success", result.error
    assert [r["result"] for r in of_type(chunks, "tool-result")] == [{"result": 2}, {"result": "second"}]


async def test_progress_notifications_reach_the_stream_as_data_chunks(server: dict[str, Any]) -> None:
    """H6 for MCP tools: the server's notifications/progress of a call are the call's
    ``data-tool-progress`` chunks, in order, before its tool-result (the next call's after it)."""
    cfg = config(
        top={"mcpServers": {"calc": server}},
        tools={"progress": {"mcp": "calc"}, "add": {"mcp": "calc"}},
        responses=[{"toolCalls": [call("progress", steps=3), call("add", a=1, b=2)]}, DONE],
    )
    async with App(cfg) as app:
        chunks, result = await collect(app)
    assert result.status == "success", result.error
    kinds = [c["type"] for c in chunks if c["type"] in ("data-tool-progress", "tool-result")]
    assert kinds == ["data-tool-progress"] * 3 + ["tool-result", "tool-result"]
    progress = [c["data"] for c in chunks if c["type"] == "data-tool-progress"]
    assert progress == [
        {"toolCallId": "call_1", "toolName": "progress", "progress": n, "total": 3, "message": f"step {n}"}
        for n in (1, 2, 3)
    ]
