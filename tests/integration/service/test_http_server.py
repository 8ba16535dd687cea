"""The HTTP server's sockets (real ones, on 127.0.0.1): TCP_NODELAY and a bounded send buffer on
every accepted connection, and a client that stops reading is cut after the deadline."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import PlainTextResponse, StreamingResponse

from procmesh_orchestrator.service.http.server import SEND_BUFFER_BYTES, HttpServer


async def app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/endless":

        async def body() -> AsyncIterator[bytes]:
            while True:
                yield b"x" * 65536
                await asyncio.sleep(0)  # a client gone makes send() return at once: let the cancel in

        await StreamingResponse(body())(scope, receive, send)
        return
    await PlainTextResponse("ok")(scope, receive, send)


def server_sockets(server: HttpServer) -> list[socket.socket]:
    connections = server._server.server_state.connections
    return [c.transport.get_extra_info("socket") for c in connections]


async def test_accepted_connections_have_tcp_nodelay_and_a_bounded_send_buffer() -> None:
    server = HttpServer(app, "127.0.0.1", 0)
    await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await reader.readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        (accepted,) = server_sockets(server)
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        # Linux reports twice what was set (its bookkeeping), never the autotuned megabytes
        assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * SEND_BUFFER_BYTES
        writer.close()
    finally:
        await server.stop()


async def test_a_client_that_stops_reading_is_cut_and_one_that_reads_is_not() -> None:
    cut: list[float] = []
    server = HttpServer(app, "127.0.0.1", 0, slow_client_seconds=1.0, on_slow_client=lambda: cut.append(1))
    await server.start()
    try:
        silent = socket.create_connection(("127.0.0.1", server.port))
        silent.sendall(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        read = 0
        while not cut:  # the reader reads on while the silent client's deadline passes
            assert loop.time() < deadline, "the client that does not read was never cut"
            read += len(await reader.read(1 << 20))
        # longer than the deadline, reading all along (a pause here would be a slow client too)
        until = loop.time() + 1.5
        while loop.time() < until:
            read += len(await reader.read(1 << 20))
        assert cut == [1]
        assert len(await reader.read(1 << 20)) > 0
        assert read > 0
        silent.settimeout(10)
        received = 0
        try:
            while piece := silent.recv(1 << 20):  # what the kernel held, then the end
                received += len(piece)
        except ConnectionResetError:
            pass
        assert received < 8 * 1024 * 1024
        silent.close()
        writer.close()
    finally:
        await server.stop()
