"""The boundary to the `mcp` SDK: transports, results as JSON, and SDK errors in words."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any

import anyio
import httpx2  # the SDK's HTTP client (a dependency of mcp): streamable_http_client takes one
from mcp import StdioServerParameters, stdio_client
from mcp.client import Transport
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, INVALID_REQUEST, CallToolResult, TextContent

from procmesh_orchestrator.tools.mcp._types import McpServerConfig

# How long an HTTP response stream may stay silent: a tool call's own timeout bounds the wait.
_SSE_READ_TIMEOUT = 300.0


def content(result: CallToolResult) -> Any:
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


def describe(exc: BaseException, config: McpServerConfig) -> str:
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


def is_broken(exc: BaseException) -> bool:
    """Whether a failed call means the connection is gone (not: the server answered an error)."""
    if isinstance(exc, MCPError):
        # INVALID_REQUEST "Session terminated": the HTTP transport's word for a session the server
        # no longer knows (it restarted).
        return exc.code == CONNECTION_CLOSED or (
            exc.code == INVALID_REQUEST and exc.message == "Session terminated"
        )
    return isinstance(exc, OSError | httpx2.HTTPError | anyio.BrokenResourceError | anyio.ClosedResourceError)


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


@asynccontextmanager
async def open_transport(
    config: McpServerConfig, on_end: Callable[[], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """The SDK transport `config` names, its read stream watched: `on_end` runs when it ends."""
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
