"""uvicorn serving the HTTP API inside the orchestrator's own event loop, with a deadline on request heads."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from procmesh_orchestrator.errors import ServiceStartError


class _H11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on every request head.

    uvicorn closes idle keep-alive connections, but any byte received disarms that timer, so a
    client that trickles a request head (slow loris) kept its connection forever. Here a head
    must be complete within ``timeout_keep_alive`` (our ``header_timeout_seconds``) of the
    connection opening or of the previous response ending, or the connection is closed.
    """

    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_timer = self.loop.call_later(self.timeout_keep_alive, self._head_overdue)

    def _head_overdue(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE:  # still no complete request head
            self.timeout_keep_alive_handler()

    def handle_events(self) -> None:
        super().handle_events()
        if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
            self._head_timer.cancel()  # a request head arrived
            self._head_timer = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the orchestrator owns SIGTERM (drain first)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class HttpServer:
    """uvicorn serving the HTTP API inside the running event loop."""

    def __init__(
        self, app: ASGIApp, host: str, port: int, *, max_connections: int = 512, header_timeout: float = 10.0
    ) -> None:
        try:
            self._socket = socket.create_server((host, port))
        except OSError as exc:
            raise OSError(f"cannot bind the HTTP API to {host}:{port}: {exc.strerror or exc}") from None
        self._socket.setblocking(False)
        self.host = host
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=1,
            server_header=False,
            http=_H11,
            timeout_keep_alive=header_timeout,  # type: ignore[arg-type]  # a float works as well
            limit_concurrency=max_connections,
        )
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start serving; returns once the socket accepts connections."""
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]), name="procmesh-http")
        while not self._server.started:
            if self._task.done():
                await self._task  # raises what made uvicorn fail
                raise ServiceStartError("the HTTP server stopped during start-up")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        """Stop accepting, close idle connections, cancel what is left after one second."""
        if self._task is None:
            return
        self._server.should_exit = True
        await self._task
        self._task = None
