"""A real HTTP file server on 127.0.0.1 for attachment downloads (stdlib ThreadingHTTPServer)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FileServer:
    """Serves `files` (path -> [(status, body, content type)]): the n-th GET of a path gets the n-th
    answer (the last repeats: a signed URL that fails once); a 30x answer's body is its Location.
    Every GET is counted per path."""

    def __init__(self) -> None:
        self.files: dict[str, list[tuple[int, bytes, str]]] = {}
        self.hits: dict[str, int] = {}
        self.hosts: list[str] = []
        """The Host header of every GET."""
        server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                n = owner.hits.get(path, 0)
                owner.hits[path] = n + 1
                answers = owner.files.get(path) or [(404, b"not found", "text/plain")]
                status, body, media_type = answers[min(n, len(answers) - 1)]
                if status in (301, 302, 307, 308):  # the body is the Location
                    self.send_response(status)
                    self.send_header("Location", body.decode())
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                owner.hosts.append(self.headers.get("Host", ""))
                self.send_response(status)
                self.send_header("Content-Type", media_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler

    def reset(self) -> None:
        self.files.clear()
        self.hits.clear()
        self.hosts.clear()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
