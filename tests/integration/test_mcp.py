"""The MCP client against a real MCP server process (tests/fixtures/mcp_server.py), both transports.

stdio: each connection starts its own server process. HTTP: one server per module on a free port
(the crash test runs its own, since it kills it). The server appends ``started <pid>`` and
``cancelled <seconds>`` lines to an events file, which is how the tests see restarts and
cancellations arrive.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from procmesh_orchestrator.errors import McpError, OrchestratorError
from procmesh_orchestrator.tools.mcp import McpConnection, McpServerConfig

SERVER = Path(__file__).resolve().parent.parent / "fixtures" / "mcp_server.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class HttpServer:
    """An HTTP MCP server process on a fixed port, which a test may kill and start again."""

    port: int
    events: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, timeout: float = 15.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), "--transport", "http", "--port", str(self.port)],
            env={**os.environ, "MCP_FIXTURE_EVENTS": str(self.events)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while True:  # ready once the port accepts connections
            assert self.proc.poll() is None, f"the MCP HTTP server exited with {self.proc.returncode}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                assert time.monotonic() < deadline, f"the MCP HTTP server is not listening after {timeout}s"
                time.sleep(0.05)

    def wait_exit(self, timeout: float = 5.0) -> None:
        assert self.proc is not None
        self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServer]:
    server = HttpServer(_free_port(), tmp_path_factory.mktemp("mcp-http") / "events")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return tmp_path / "events"


@pytest.fixture(params=["stdio", "http"])
def config(request: pytest.FixtureRequest, events: Path) -> McpServerConfig:
    if request.param == "stdio":
        return McpServerConfig(
            name="fixture",
            command=[sys.executable, str(SERVER), "--transport", "stdio"],
            env={"MCP_FIXTURE_EVENTS": str(events)},
            timeout=15.0,
        )
    server: HttpServer = request.getfixturevalue("http_server")
    return McpServerConfig(name="fixture", url=server.url, timeout=15.0)


def _events_file(config: McpServerConfig, request: pytest.FixtureRequest) -> Path:
    if config.command is not None:
        return Path(config.env["MCP_FIXTURE_EVENTS"])
    server: HttpServer = request.getfixturevalue("http_server")
    return server.events


@pytest.fixture
def event_lines(config: McpServerConfig, request: pytest.FixtureRequest) -> Callable[[], list[str]]:
    """The lines the server has recorded since the test began (the HTTP server is shared)."""
    path = _events_file(config, request)
    skip = len(path.read_text().splitlines()) if path.exists() and config.url else 0
    return lambda: path.read_text().splitlines()[skip:] if path.exists() else []


@pytest.fixture
async def conn(config: McpServerConfig) -> AsyncIterator[McpConnection]:
    connection = McpConnection(config)
    await connection.start()
    yield connection
    await connection.close()


async def _wait_for(lines: Callable[[], list[str]], line: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while line not in lines():
        assert time.monotonic() < deadline, f"the server never recorded {line!r}: {lines()}"
        await asyncio.sleep(0.05)


async def test_list_tools_gives_names_descriptions_and_schemas(conn: McpConnection) -> None:
    tools = {tool.name: tool for tool in await conn.list_tools()}
    assert set(tools) == {"add", "lookup", "slow", "crash", "context", "progress"}
    add = tools["add"]
    assert add.server == "fixture"
    assert add.description == "Add two numbers."
    assert add.input_schema["type"] == "object"
    assert set(add.input_schema["properties"]) == {"a", "b"}
    assert add.input_schema["properties"]["a"]["type"] == "number"
    assert tools["lookup"].input_schema["required"] == ["key"]


async def test_call_tool_returns_structured_content_and_calls_run_concurrently(conn: McpConnection) -> None:
    result = await conn.call_tool("add", {"a": 2, "b": 3.5})
    assert result.content == {"result": 5.5}
    assert not result.is_error
    slow = asyncio.create_task(conn.call_tool("slow", {"seconds": 0.5}))
    lookups = await asyncio.gather(*(conn.call_tool("lookup", {"key": k}) for k in ["alpha", "beta"] * 3))
    assert not slow.done()  # the quick calls did not wait behind the slow one
    assert [r.content for r in lookups] == [{"result": "first"}, {"result": "second"}] * 3
    assert (await slow).content == {"result": "slept"}


async def test_meta_reaches_the_server_in_params_meta(conn: McpConnection) -> None:
    meta = {"procmesh/requestContext": {"tenant": "t1", "tier": "gold"}}
    with_meta = await conn.call_tool("context", {}, meta=meta)
    assert with_meta.content == {"result": '{"tenant": "t1", "tier": "gold"}'}
    assert (await conn.call_tool("context", {})).content == {"result": "null"}


async def test_a_tool_that_raises_is_an_error_result_not_an_exception(conn: McpConnection) -> None:
    result = await conn.call_tool("lookup", {"key": "nope"})
    assert result.is_error
    assert "no such key: nope" in result.content
    assert (await conn.call_tool("add", {"a": 1, "b": 1})).content == {"result": 2}


async def test_a_timeout_is_an_mcp_error_naming_the_server_and_cancels_the_call(
    conn: McpConnection, event_lines: Callable[[], list[str]]
) -> None:
    # The tool would sleep past the test's own time limit (pytest-timeout, 120 s): a call held until
    # the tool answers cannot pass, and no clock is asserted.
    with pytest.raises(
        McpError, match=r"MCP server 'fixture': tools/call 'slow' timed out after 0.3s"
    ) as info:
        await conn.call_tool("slow", {"seconds": 600}, timeout=0.3)
    assert isinstance(info.value, OrchestratorError)
    assert info.value.server == "fixture"
    await _wait_for(event_lines, "cancelled 600")
    assert (await conn.call_tool("add", {"a": 1, "b": 2})).content == {"result": 3}  # the session lives on


async def test_cancelling_the_caller_cancels_the_request_on_the_server(
    conn: McpConnection, event_lines: Callable[[], list[str]]
) -> None:
    call = asyncio.create_task(conn.call_tool("slow", {"seconds": 8}))
    await _wait_for(event_lines, "sleeping 8")  # not a fixed sleep: under load 0.3 s was not enough
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await _wait_for(event_lines, "cancelled 8")
    assert (await conn.call_tool("add", {"a": 1, "b": 2})).content == {"result": 3}


async def test_a_stdio_server_that_dies_is_restarted_by_the_next_call(events: Path) -> None:
    config = McpServerConfig(
        name="fixture",
        command=[sys.executable, str(SERVER)],
        env={"MCP_FIXTURE_EVENTS": str(events)},
        timeout=15.0,
    )
    async with McpConnection(config) as conn:
        with pytest.raises(McpError, match=r"'fixture': tools/call 'crash' failed: the connection closed"):
            await conn.call_tool("crash", {})
        assert (await conn.call_tool("add", {"a": 1, "b": 2})).content == {"result": 3}
        pids = _started_pids(events)
        assert len(pids) == 2  # one restart, a new process
    _assert_gone(pids[1])  # close() stopped the server process


async def test_an_http_server_that_dies_fails_the_next_call_until_it_is_back(tmp_path: Path) -> None:
    server = HttpServer(_free_port(), tmp_path / "events")
    server.start()
    try:
        async with McpConnection(McpServerConfig(name="remote", url=server.url, timeout=5.0)) as conn:
            with pytest.raises(McpError, match=r"'remote': tools/call 'crash' failed"):
                await conn.call_tool("crash", {})
            server.wait_exit()
            with pytest.raises(
                McpError, match=rf"'remote': start failed: cannot connect to URL {server.url}"
            ):
                await conn.call_tool("add", {"a": 1, "b": 2})
            server.start()
            assert (await conn.call_tool("add", {"a": 1, "b": 2})).content == {"result": 3}
    finally:
        server.stop()


async def test_close_is_idempotent_and_stops_the_stdio_server(events: Path) -> None:
    conn = McpConnection(
        McpServerConfig(
            name="fixture", command=[sys.executable, str(SERVER)], env={"MCP_FIXTURE_EVENTS": str(events)}
        )
    )
    await conn.start()
    (pid,) = _started_pids(events)
    await conn.close()
    await conn.close()
    _assert_gone(pid)
    with pytest.raises(McpError, match="the connection is closed"):
        await conn.list_tools()


def _started_pids(events: Path) -> list[int]:
    return [int(line.split()[1]) for line in events.read_text().splitlines() if line.startswith("started")]


def _assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_missing_command_is_a_clear_error() -> None:
    conn = McpConnection(McpServerConfig(name="ghost", command=["/nonexistent/mcp-server", "--x"]))
    with pytest.raises(
        McpError, match=r"MCP server 'ghost': start failed: command '/nonexistent/mcp-server' not found"
    ):
        await conn.start()
    await conn.close()


async def test_a_server_that_exits_at_once_is_a_clear_error() -> None:
    conn = McpConnection(
        McpServerConfig(name="quitter", command=[sys.executable, "-c", "raise SystemExit(2)"])
    )
    with pytest.raises(
        McpError, match=r"'quitter': start failed: the connection closed \(the server process exited\)"
    ):
        await conn.start()
    await conn.close()


async def test_an_unreachable_url_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{_free_port()}/mcp"
    conn = McpConnection(McpServerConfig(name="remote", url=url, timeout=5.0))
    with pytest.raises(McpError, match=rf"MCP server 'remote': start failed: cannot connect to URL {url}"):
        await conn.start()
    await conn.close()


async def test_a_server_that_never_answers_times_out_at_start_up() -> None:
    # silent past the test's own time limit (120 s): only the start-up timeout can end the start
    silent = [sys.executable, "-c", "import time; time.sleep(600)"]
    conn = McpConnection(McpServerConfig(name="mute", command=silent, timeout=0.5))
    with pytest.raises(McpError, match=r"'mute': start-up took over 0.5s"):
        await conn.start()


def test_a_config_takes_exactly_one_of_command_and_url() -> None:
    with pytest.raises(ValueError, match="exactly one of command and url"):
        McpServerConfig(name="both", command=["x"], url="http://h/mcp")
    with pytest.raises(ValueError, match="exactly one of command and url"):
        McpServerConfig(name="neither")
