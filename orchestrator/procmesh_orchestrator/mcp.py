"""A client for Model Context Protocol servers, whose tools an agent can take.

One `McpConnection` per configured server, over stdio (this process starts the server) or
streamable HTTP, through the official `mcp` SDK. The SDK's transports and session are anyio
context managers whose task groups must be entered and exited by one task, so each connection
runs them in a long-lived background task (the *host*) and callers talk to the session it holds:
requests from many tasks share it, and a caller that is cancelled cancels its request (the SDK
sends ``notifications/cancelled``) without touching the session.

When the server dies (the stdio process exits, the HTTP transport fails) the host ends; the next
call starts a new one once (stdio: a new process) and fails with `McpError` if that fails too. A
call that was in flight when the connection broke is not resent: the tool may have run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

import anyio
import httpx2  # the SDK's HTTP client (a dependency of mcp): streamable_http_client takes one
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client import Transport
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, INVALID_REQUEST, CallToolResult, TextContent

from procmesh_orchestrator.errors import McpError

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# How long an HTTP response stream may stay silent: a tool call's own timeout bounds the wait.
_SSE_READ_TIMEOUT = 300.0
# The SDK's own bound on a stdio server's shutdown (2s after stdin closes, 2s after SIGTERM, 2s reap).
_SHUTDOWN_GRACE = 7.0


@dataclass(frozen=True)
class McpServerConfig:
    """How to reach one MCP server: `command` (stdio) or `url` (streamable HTTP), never both."""

    name: str
    command: list[str] | None = None
    """stdio: the server's argv; the process gets the SDK's safe default environment plus `env`."""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    """Streamable HTTP: the endpoint, e.g. ``http://127.0.0.1:8000/mcp``."""
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    """Seconds for start-up (connect + initialize) and for each call."""

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: set exactly one of command and url")
        if self.command is not None and not self.command:
            raise ValueError(f"MCP server {self.name!r}: command is empty")


@dataclass(frozen=True)
class McpTool:
    """A tool as the server lists it."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class McpResult:
    """A tool's answer: `content` is the JSON the model sees, `is_error` the server's isError."""

    content: Any
    is_error: bool


def _content(result: CallToolResult) -> Any:
    """structuredContent when present, else the text joined, else the content blocks as JSON."""
    if result.structured_content is not None:
        return result.structured_content
    if all(isinstance(block, TextContent) for block in result.content):
        return "\n".join(block.text for block in result.content if isinstance(block, TextContent))
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, which anyio's task groups raise."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _describe(exc: BaseException, config: McpServerConfig) -> str:
    """What failed, in words: the one place SDK, OS and HTTP errors become `McpError` causes."""
    leaf = next((e for e in _leaves(exc) if not isinstance(e, asyncio.CancelledError)), exc)
    where = f"command {config.command[0]!r}" if config.command else f"URL {config.url}"
    if isinstance(leaf, FileNotFoundError):
        return f"{where} not found"
    if isinstance(leaf, PermissionError):
        return f"{where} cannot be run (permission denied)"
    if isinstance(leaf, httpx2.ConnectError):
        return f"cannot connect to {where}: {leaf}"
    if isinstance(leaf, httpx2.HTTPError):
        return f"HTTP to {where} failed: {type(leaf).__name__}: {leaf}"
    if isinstance(leaf, MCPError) and leaf.code == CONNECTION_CLOSED:
        return "the connection closed" + (" (the server process exited)" if config.command else "")
    if isinstance(leaf, MCPError):
        return f"error {leaf.code}: {leaf.message}"
    return f"{type(leaf).__name__}: {leaf}"


def _is_broken(exc: BaseException) -> bool:
    """Whether a failed call means the connection is gone (else: the server answered an error)."""
    if not isinstance(exc, MCPError):
        return True
    # The HTTP transport's word for a session the server no longer knows (it restarted).
    return exc.code == CONNECTION_CLOSED or (
        exc.code == INVALID_REQUEST and exc.message == "Session terminated"
    )


class _WatchedReadStream:
    """The transport's read stream, telling the connection when the server has gone (end of stream)."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:
        """The sender's contextvars, which the SDK's dispatcher reads where a transport keeps them."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        """The next message; at the end of the stream, report it and re-raise."""
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise
        return item

    async def aclose(self) -> None:
        """Close the inner stream."""
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


@dataclass
class _Host:
    """The background task that holds one session, and the handles to end it."""

    ready: asyncio.Future[Client]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    task: asyncio.Task[None] = field(init=False)


class McpConnection:
    """One MCP server's session: start, list its tools, call them (concurrently), close."""

    def __init__(self, config: McpServerConfig) -> None:
        self.config = config
        self._client: Client | None = None
        self._host: _Host | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def start(self) -> None:
        """Connect and initialize; raises `McpError` saying which server and what failed."""
        await self._session()

    async def list_tools(self) -> list[McpTool]:
        """Every tool the server lists (all pages)."""
        tools: list[McpTool] = []
        cursor: str | None = None
        while True:
            page = await self._request("tools/list", partial(Client.list_tools, cursor=cursor), None)
            tools += [
                McpTool(self.config.name, t.name, t.description or "", dict(t.input_schema))
                for t in page.tools
            ]
            cursor = page.next_cursor
            if cursor is None:
                return tools

    async def call_tool(self, name: str, args: dict[str, Any], timeout: float | None = None) -> McpResult:
        """Call tool `name`; `timeout` (default: the server's) bounds the call, then `McpError`."""
        result = await self._request(
            f"tools/call {name!r}", partial(Client.call_tool, name=name, arguments=args), timeout
        )
        return McpResult(_content(result), result.is_error)

    async def close(self) -> None:
        """End the session (stops a stdio server process); idempotent."""
        self._closed = True
        async with self._lock:
            await self._stop_host()

    async def __aenter__(self) -> McpConnection:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _request(self, what: str, send: Callable[[Client], Awaitable[_T]], timeout: float | None) -> _T:
        client = await self._session()
        limit = self.config.timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                return await send(client)
        except TimeoutError:
            # The timeout cancelled the request, and the SDK told the server (notifications/cancelled).
            raise McpError(self.config.name, f"{what} timed out after {limit:g}s") from None
        except Exception as exc:
            if _is_broken(exc):
                # Not resent: the server may have run it. The next call reconnects.
                await self._abandon(client)
            raise McpError(self.config.name, f"{what} failed: {_describe(exc, self.config)}") from exc

    async def _session(self) -> Client:
        """The live session, starting the host first when there is none or it has ended."""
        async with self._lock:
            if self._closed:
                raise McpError(self.config.name, "the connection is closed")
            if self._host is None or self._host.task.done():
                await self._stop_host()
                await self._start_host()
            assert self._client is not None
            return self._client

    async def _abandon(self, client: Client) -> None:
        async with self._lock:
            if self._client is client:
                await self._stop_host()

    async def _start_host(self) -> None:
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        host = _Host(ready)
        host.task = asyncio.create_task(self._run_host(host), name=f"mcp {self.config.name}")
        self._host = host
        try:
            async with asyncio.timeout(self.config.timeout):
                self._client = await asyncio.shield(ready)
        except BaseException as exc:
            await self._stop_host(cancel=True)
            if isinstance(exc, TimeoutError):
                raise McpError(self.config.name, f"start-up took over {self.config.timeout:g}s") from None
            if isinstance(exc, Exception):
                raise McpError(self.config.name, f"start failed: {_describe(exc, self.config)}") from exc
            raise

    async def _stop_host(self, *, cancel: bool = False) -> None:
        """End the host: let it leave its context managers, or cancel what it is doing.

        Cancelled through its anyio scope, not `Task.cancel()`: the SDK shields the stdio
        shutdown (close stdin, then SIGTERM and SIGKILL the process group, each wait bounded)
        from anyio cancellation only.
        """
        host, self._host, self._client = self._host, None, None
        if host is None:
            return
        host.stop.set()
        if cancel:
            host.scope.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(host.task), self.config.timeout + _SHUTDOWN_GRACE)
        except TimeoutError:
            host.task.cancel()
        await asyncio.gather(host.task, return_exceptions=True)

    async def _run_host(self, host: _Host) -> None:
        """Own the transport and session context managers, from connect to shutdown, in one task."""
        ready = host.ready
        try:
            with host.scope:
                async with Client(self._transport(host.stop.set), cache=None) as client:
                    ready.set_result(client)
                    await host.stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning(
                    "MCP server %r: connection ended: %s", self.config.name, _describe(exc, self.config)
                )
        finally:
            if not ready.done():
                ready.cancel()

    @asynccontextmanager
    async def _transport(self, on_end: Callable[[], None]) -> AsyncIterator[tuple[Any, Any]]:
        config = self.config
        async with AsyncExitStack() as stack:
            inner: Transport
            if config.command is not None:
                params = StdioServerParameters(
                    command=config.command[0], args=config.command[1:], env=config.env or None, cwd=config.cwd
                )
                inner = stdio_client(params)
            else:
                assert config.url is not None
                http = httpx2.AsyncClient(
                    headers=config.headers,
                    timeout=httpx2.Timeout(config.timeout, read=_SSE_READ_TIMEOUT),
                )
                await stack.enter_async_context(http)
                inner = streamable_http_client(config.url, http_client=http)
            read, write = await stack.enter_async_context(inner)
            yield _WatchedReadStream(read, on_end), write
