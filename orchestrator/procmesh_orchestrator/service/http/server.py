"""uvicorn serving the HTTP API inside the orchestrator's own event loop: a deadline on request heads,
a deadline on clients that stop reading, and no Nagle delay on responses."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from procmesh_orchestrator.errors import ServiceStartError
from procmesh_orchestrator.service._tls import ServerTls

SEND_BUFFER_BYTES = 256 * 1024
"""The kernel's send buffer of each HTTP connection (SO_SNDBUF; Linux doubles it for its own
accounting). Left to autotuning it grows to ``net.ipv4.tcp_wmem``'s maximum (4 MiB or more): a
client that does not read took that much of a run's output before the run paused, and the pod's
memory (socket buffers count against its cgroup) that much per connection. 256 KiB is some
seconds of the fastest token stream and keeps a large JSON response at several MB/s over 100 ms
of round trip."""


class _H11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on every request head and on a stalled reader, and
    TCP_NODELAY on every connection.

    uvicorn closes idle keep-alive connections, but any byte received disarms that timer, so a
    client that trickles a request head (slow loris) kept its connection forever. Here a head
    must be complete within ``timeout_keep_alive`` (our ``header_timeout_seconds``) of the
    connection opening or of the previous response ending, or the connection is closed.

    A response waits for its client to read (uvicorn stops sending while the transport's buffer
    is over its high-water mark, and a streamed run then pauses: `ChunkBuffer`); a client that
    leaves it waiting longer than `slow_client_seconds` is cut (the transport aborted: its
    buffered bytes are dropped) and its request ends as a disconnect does. `on_slow_client` is
    told (the metric and the log line).

    asyncio sets TCP_NODELAY only on sockets created with ``proto=IPPROTO_TCP``, which an accepted
    socket of ``socket.create_server`` is not: the second write of a response (head, then body)
    waited for the client's delayed ACK, about 40 ms per keep-alive request. The send buffer is
    bounded too (`SEND_BUFFER_BYTES`).
    """

    _head_timer: asyncio.TimerHandle | None = None
    _stall_timer: asyncio.TimerHandle | None = None
    slow_client_seconds: float = 0.0
    """0: a client that does not read is never cut (set by `HttpServer` on its subclass)."""
    on_slow_client: tuple[Callable[[], None], ...] = ()
    """Told of each cut (a tuple: a function as a class attribute would become a method)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        super().connection_made(transport)
        self._arm_head_timer()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None and self.slow_client_seconds > 0:
            self._stall_timer = self.loop.call_later(self.slow_client_seconds, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _stalled(self) -> None:
        self._stall_timer = None
        if self.transport.is_closing() and self.transport.get_write_buffer_size() == 0:
            return
        for told in self.on_slow_client:
            told()
        self.transport.abort()  # connection_lost follows: the request sees a disconnect

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
        for timer in (self._head_timer, self._stall_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._stall_timer = None
        super().connection_lost(exc)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the orchestrator owns SIGTERM (drain first)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


def _uvicorn_tls(tls: ServerTls) -> dict[str, Any]:
    """uvicorn's TLS settings: it builds its context from the same files (`ServerTls` checked them)."""
    return {
        "ssl_certfile": tls.cert_path,
        "ssl_keyfile": tls.key_path,
        "ssl_ca_certs": tls.client_ca_path,
        "ssl_cert_reqs": ssl.CERT_REQUIRED if tls.mutual else ssl.CERT_NONE,
    }


class HttpServer:
    """uvicorn serving the HTTP API inside the running event loop."""

    def __init__(
        self,
        app: ASGIApp,
        host: str,
        port: int,
        *,
        max_connections: int = 512,
        header_timeout: float = 10.0,
        slow_client_seconds: float = 0.0,
        on_slow_client: Callable[[], None] | None = None,
        tls: ServerTls | None = None,
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
            http=type(
                "_H11",
                (_H11,),
                {
                    "slow_client_seconds": slow_client_seconds,
                    "on_slow_client": (on_slow_client,) if on_slow_client is not None else (),
                },
            ),
            timeout_keep_alive=header_timeout,  # type: ignore[arg-type]  # a float works as well
            limit_concurrency=max_connections,
            **(_uvicorn_tls(tls) if tls is not None else {}),
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
