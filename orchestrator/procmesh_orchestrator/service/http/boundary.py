"""The HTTP room's outermost layer: the Host check, API keys and in-flight limits on /api/*, the
request counter and latency by route template, and the last word on unexpected errors."""

from __future__ import annotations

import contextlib
import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from procmesh_orchestrator.service._errors import ServiceError
from procmesh_orchestrator.service._logs import RateLimitedLog
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.http.bodies import error_response

log = logging.getLogger(__name__)

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
DISCONNECTED = "499"
"""The status counted for a request whose client left before any response (nginx's convention)."""


def host_allowed(header: str, allowed: list[str]) -> bool:
    """Whether a ``Host`` header names an allowed host (port ignored; ``*.x`` wildcards; ``*``: any)."""
    if "*" in allowed:
        return True
    host = header.strip().lower()
    if host.startswith("["):  # [::1]:4111
        host = host[1 : host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    for pattern in allowed:
        pattern = pattern.lower()
        if host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:])):
            return True
    return False


def allowed_hosts(service: ServiceCore) -> list[str]:
    """The configured hosts, or the default: any with API keys (or when told to be open), else loopback."""
    settings = service.settings
    if settings.allowed_hosts is not None:
        return settings.allowed_hosts
    if settings.api_keys or settings.allow_unauthenticated:
        return ["*"]
    return list(LOOPBACK_HOSTS)


class Boundary:
    """Outermost ASGI layer: Host check, API keys on /api/*, the request counter by status code, and
    the last word on unexpected errors (one rate-limited WARNING, never the request's content)."""

    def __init__(self, app: ASGIApp, service: ServiceCore) -> None:
        self._app = app
        self._service = service
        self._hosts = allowed_hosts(service)
        self._unexpected = RateLimitedLog(log, "unexpected error serving an HTTP request")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        status: int | None = None
        started = time.perf_counter()

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
            if not host_allowed(host, self._hosts):
                await error_response(400, "Host not allowed (set PROCMESH_ALLOWED_HOSTS to serve this name)")(
                    scope, receive, counting_send
                )
                return
            if scope["path"].startswith("/api/") or scope["path"] == "/api":
                # every value: a header given twice is refused, never last-wins
                given = [v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"]
                try:
                    caller = self._service.keys.identify(given)
                    caller.check_runs_agents()  # a @gateway key: the model gateway only
                except ServiceError as exc:
                    await error_response(exc.http_status, str(exc))(scope, receive, counting_send)
                    return
                scope.setdefault("state", {})["caller"] = caller  # the handlers' caller_of(request)
                try:
                    give_back = self._service.key_limits.take(caller)
                except ServiceError as exc:  # this key's requests in flight: 429 naming the limit
                    await error_response(exc.http_status, str(exc))(scope, receive, counting_send)
                    return
                try:
                    await self._app(scope, receive, counting_send)
                finally:
                    give_back()
                return
            await self._app(scope, receive, counting_send)
        except Exception as exc:
            # Starlette re-raises after its 500 handler ran (or the client left mid-stream): log
            # the class only, rate-limited, so no request can flood the log or leak its content.
            self._unexpected.warning(f"{scope['method']} {scope['path']}: {type(exc).__name__}")
            if status is None:
                with contextlib.suppress(Exception):
                    await error_response(500, "internal error")(scope, receive, counting_send)
        finally:
            code = DISCONNECTED if status is None else str(status)
            self._service.metrics.requests.labels("http", code).inc()
            # Starlette's router leaves the matched route in the scope: its template bounds the
            # label's values (an unknown path is "other", whatever was asked).
            route = scope.get("route")
            template = getattr(route, "path", None) if route is not None else None
            self._service.metrics.http_latency.labels(template or "other", code).observe(
                time.perf_counter() - started
            )
