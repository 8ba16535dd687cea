"""`McpConnection`: one MCP server's session, held by a background task (see the package doc)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar, cast

import anyio
from mcp import Client
from mcp.shared.dispatcher import ProgressFnT

from procmesh_orchestrator.errors import McpError
from procmesh_orchestrator.tools.mcp._sdk import content, describe, is_broken, open_transport
from procmesh_orchestrator.tools.mcp._types import McpResult, McpServerConfig, McpTool

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# The SDK's own bound on a stdio server's shutdown (2s after stdin closes, 2s after SIGTERM, 2s reap).
_SHUTDOWN_GRACE = 7.0


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

    async def call_tool(
        self,
        name: str,
        args: dict[str, Any],
        timeout: float | None = None,
        meta: dict[str, Any] | None = None,
        progress: ProgressFnT | None = None,
    ) -> McpResult:
        """Call tool `name`; `timeout` (default: the server's) bounds the call, then `McpError`;
        `meta` goes in the request's ``params._meta`` (the run's request context); `progress`
        gets the call's progress notifications (the request then carries a progress token)."""
        send = partial(
            Client.call_tool,
            name=name,
            arguments=args,
            meta=cast(Any, meta) or None,
            progress_callback=progress,
        )
        result = await self._request(f"tools/call {name!r}", send, timeout)
        return McpResult(content(result), result.is_error)

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
            if is_broken(exc):
                # Not resent: the server may have run it. The next call reconnects.
                await self._abandon(client)
            raise McpError(self.config.name, f"{what} failed: {describe(exc, self.config)}") from exc

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
                raise McpError(self.config.name, f"start failed: {describe(exc, self.config)}") from exc
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
                async with Client(open_transport(self.config, host.stop.set), cache=None) as client:
                    ready.set_result(client)
                    await host.stop.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:
                log.warning(
                    "MCP server %r: connection ended: %s", self.config.name, describe(exc, self.config)
                )
        finally:
            if not ready.done():
                ready.cancel()
