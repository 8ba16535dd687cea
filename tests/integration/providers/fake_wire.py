"""The HTTP side of the fake provider APIs (fakes.py): the server, the handler that answers a
request from its API's script, and the record of each streamed answer.

Besides whole answers, rejections and cut streams, a scripted reply may hold: ``"holdAfter": n``
sends n events (a whole answer: its head only), then nothing until the reader goes away, like a
model that never finishes; the API's `held` and `released` events say when that happened, so a
test sees a client's abort reach the model server.
"""

from __future__ import annotations

import itertools
import json
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.integration.providers.fakes import FakeAPI

Event = tuple[str | None, Any]


@dataclass
class Stream:
    """One streamed answer: the bytes its reader's socket took, and whether the reader went away
    before the end."""

    sent: int = 0
    cut: bool = False


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default listen backlog is 5. A guard judges a streamed answer's windows at
    # once (up to the providers' 64 pooled connections); under load the accept loop falls behind,
    # the kernel drops or cookie-answers the overflow, and some of those connections are reset.
    request_queue_size = 256

    def __init__(self, api: FakeAPI) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.api = api

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that drop a connection (an abandoned stream, a closed pool) are not errors here."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        # A head and its body are two writes: with Nagle's algorithm on, the body waited for the
        # head's ACK, which a kept-alive client delays up to 40 ms (P8's judge round trip was 244
        # ms for its 200 ms delay, and the orchestrator's judge calls paid it at random). Servers
        # of real providers answer without that stall; so does this one.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self) -> None:
        api = self.server.api
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != api.path:
            self._json(404, {"error": {"type": "not_found_error", "message": f"no route {self.path}"}})
            return
        body = json.loads(raw or b"{}")
        headers = {k.lower(): v for k, v in self.headers.items()}
        reply = api.respond(self.path, headers, body)
        if "status" in reply:
            payload = reply["raw"] if "raw" in reply else api.error_body(reply["error"])
            self._json(reply["status"], payload, reply.get("headers") or {})
        elif body.get("stream"):
            events = api.events(reply, body)
            if "streamError" in reply:
                events = [*itertools.islice(events, 3), api.error_event(reply["streamError"])]
            stream = api.stream_started()
            try:
                self._sse(events, stream, reply)
            except ConnectionError:
                stream.cut = True
                raise
        else:
            cut, hold = reply.get("resetAfter") is not None, reply.get("holdAfter") is not None
            self._json(200, api.message(reply, body), cut=cut, hold=hold)

    def _json(
        self,
        status: int,
        payload: Any,
        headers: dict[str, str] | None = None,
        cut: bool = False,
        hold: bool = False,
    ) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if hold:  # the head only: the body never comes
            self.wfile.flush()
            self._hold(self.server.api)
            return
        if cut:  # half the promised body, then the socket closes
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data)

    def _sse(self, events: Iterable[Event], stream: Stream, reply: dict[str, Any]) -> None:
        reset_after, hold_after = reply.get("resetAfter"), reply.get("holdAfter")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        api = self.server.api
        for i, (name, data) in enumerate(events):
            if reset_after is not None and i >= reset_after:
                # No terminating chunk: the client sees the connection close mid-body.
                self.wfile.flush()
                self.close_connection = True
                return
            if hold_after is not None and i >= hold_after:
                self._hold(api)
                stream.cut = True
                return
            text = (
                (f"event: {name}\n" if name else "")
                + "data: "
                + (data if isinstance(data, str) else json.dumps(data))
                + "\n\n"
            )
            self._chunk(text.encode())
            stream.sent += len(text)
        self._chunk(b"")

    def _hold(self, api: FakeAPI) -> None:
        """Sends nothing more until the reader closes its connection (recv gives b"")."""
        api.held.set()
        try:
            while self.connection.recv(1024):
                pass
        except OSError:
            pass
        api.released.set()
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
