"""ProcessorServer: hosts processors over gRPC (TCP and unix sockets) with health and reflection.

The lifecycle lives here (bind, setup, SERVING, drain, teardown) and TLS; the RPC handlers are
built from the hook table in `_servicer`, the output stream in `_stream`, the per-processor
bookkeeping in `_hosted`. Each processor's code runs on its own `HookLoop`, so this loop (health,
Describe, admitting calls) waits for no hook longer than one quick turn.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server

from procmesh._hosted import Hosted
from procmesh._metrics import SidecarMetrics
from procmesh._processor import Processor
from procmesh._servicer import SERVICE_NAME, Servicer
from procmesh._tool import HostedTool, Tool

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "SERVICE_NAME",
    "ProcessorServer",
    "channel_credentials",
    "server_credentials",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

# Clients ping every 30 s, with or without calls in flight (ProcessorClient's keepalive); gRPC's
# server default (one ping per 5 min, none without calls) answers that with GOAWAY
# "too_many_pings". Permit pings 10 s apart, idle connections included.
KEEPALIVE_MIN_PING_INTERVAL_MS = 10_000

# Close each connection after about 5 minutes (gRPC adds +-10% jitter) with a GOAWAY: clients
# reconnect and re-resolve, so replicas added by an autoscaler get their share of calls instead
# of none while old connections live forever. Calls in flight get 10 minutes to finish (a
# ProcessOutputStream lasts as long as the model's answer); new ones go over the new connection.
MAX_CONNECTION_AGE_MS = 5 * 60_000
MAX_CONNECTION_AGE_GRACE_MS = 10 * 60_000


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """The options of a sidecar's gRPC server: sizes, keepalive permits, connection age."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MIN_PING_INTERVAL_MS),
        ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
        ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
    ]


class ProcessorServer:
    """A gRPC server hosting processors and tools, with health and reflection.

    Use it as an async context manager, or call `start()` and `stop()`.

    Args:
        processors: The processors to host (ids must be unique).
        tools: The standalone tools to host (`Tool` instances, names unique); a sidecar may
            host tools only.
        addresses: Where to listen: ``"host:port"`` (port 0 picks a free port)
            or ``"unix:///path.sock"``. Several may be given.
        metrics_port: Serve Prometheus metrics over HTTP on this port (None: off).
        metrics_host: Where the metrics listener binds. By default where gRPC binds: the host of
            the first TCP address, loopback when every address is a unix socket.
        registry: Collector registry for the metrics (a private one by default).
        max_message_bytes: Largest request or response accepted.
        credentials: Server TLS credentials (`server_credentials()`); plaintext when None.
        hook_threads: Run each processor's code on its own thread and loop (the default), so a
            hook that computes cannot stall health checks or the other processors; False runs
            hooks inline on the server's loop, for hooks trusted to be quick (a quick hook already skips
            the thread's wake-ups while the thread is idle: `HookLoop`).
    """

    def __init__(
        self,
        processors: Sequence[Processor],
        addresses: Sequence[str] = ("127.0.0.1:0",),
        *,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        registry: CollectorRegistry | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        credentials: grpc.ServerCredentials | None = None,
        hook_threads: bool = True,
        tools: Sequence[Tool] = (),
    ) -> None:
        hosted: dict[str, Hosted] = {}
        for proc in processors:
            entry = Hosted(proc, threaded=hook_threads)
            if entry.id in hosted:
                raise ValueError(f"two processors share the id {entry.id!r}")
            if not entry.hooks:
                raise ValueError(f"processor {entry.id!r} implements no hook")
            hosted[entry.id] = entry
        hosted_tools: dict[str, HostedTool] = {}
        for tool in tools:
            entry_tool = HostedTool(tool, threaded=hook_threads)
            if entry_tool.name in hosted_tools:
                raise ValueError(f"two tools share the name {entry_tool.name!r}")
            hosted_tools[entry_tool.name] = entry_tool
        if not hosted and not hosted_tools:
            raise ValueError("ProcessorServer needs at least one processor or tool")
        self._hosted = hosted
        self._tools = hosted_tools
        self._requested = list(addresses)
        self._credentials = credentials
        self._metrics_port = metrics_port
        self._metrics_host = metrics_host
        self.registry = registry or CollectorRegistry()
        self._metrics = SidecarMetrics(self.registry)
        self._max_bytes = max_message_bytes
        self._server: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()
        self.addresses: list[str] = []
        self.metrics_server: Any = None

    @property
    def metrics_host(self) -> str:
        """The host the metrics listener binds (``metrics_host``, else where gRPC binds)."""
        if self._metrics_host is not None:
            return self._metrics_host
        for addr in self._requested:
            if not addr.startswith("unix:"):
                return addr.rsplit(":", 1)[0].strip("[]")
        return "127.0.0.1"  # unix sockets only: nothing outside this host can reach them either

    @property
    def processor_ids(self) -> list[str]:
        """The ids of the hosted processors."""
        return list(self._hosted)

    @property
    def tool_names(self) -> list[str]:
        """The names of the hosted tools."""
        return list(self._tools)

    async def start(self) -> None:
        """Run every processor's setup, bind the addresses, then report SERVING."""
        server = grpc.aio.server(options=server_options(self._max_bytes))
        self._servicer = Servicer(self._hosted, self._metrics, self._tools)
        server.add_generic_rpc_handlers((self._servicer.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            [
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            server,
        )
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        for addr in self._requested:
            if addr.startswith("unix:"):
                path = unix_path(addr)
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # a stale socket from a previous run
                self._bind(server, addr)
                self.addresses.append(addr)
            else:
                port = self._bind(server, addr)
                host = addr.rsplit(":", 1)[0]
                self.addresses.append(f"{host}:{port}")
        await server.start()
        self._server = server
        for addr in self.addresses:
            if addr.startswith("unix:"):
                os.chmod(unix_path(addr), 0o660)
        if self._metrics_port is not None:
            host = self.metrics_host
            self.metrics_server, _ = start_http_server(self._metrics_port, addr=host, registry=self.registry)
            log.info("metrics on http://%s:%d/metrics", host, self.metrics_server.server_port)
        for loop in self._loops():
            loop.start()
        try:
            for hosted in self._hosted.values():
                await hosted.loop.run(hosted.processor.setup)
            for tool in self._tools.values():
                await tool.loop.run(tool.tool.setup)
        except BaseException:
            await self.stop(grace=0)  # a failed setup leaves nothing bound
            raise
        self._servicer.ready = True
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "serving processors %s and tools %s on %s",
            self.processor_ids,
            self.tool_names,
            ", ".join(self.addresses),
        )

    def _loops(self) -> list[Any]:
        return [h.loop for h in self._hosted.values()] + [t.loop for t in self._tools.values()]

    def _bind(self, server: grpc.aio.Server, address: str) -> int:
        if self._credentials is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, self._credentials)

    async def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, let in-flight calls finish within `grace`, then tear down."""
        if self._server is None:
            return
        # Calls that arrive while draining answer UNAVAILABLE (NotReadyError), so clients retry
        # them on another replica; the ones in flight finish within `grace`.
        self._servicer.ready = False
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None
        for hosted in self._hosted.values():
            try:
                await hosted.loop.run(hosted.processor.teardown)
            except Exception:
                log.exception("teardown of %s failed", hosted.id)
            await hosted.loop.stop(timeout=max(grace, 1.0))
        for tool in self._tools.values():
            try:
                await tool.loop.run(tool.tool.teardown)
            except Exception:
                log.exception("teardown of tool %s failed", tool.name)
            await tool.loop.stop(timeout=max(grace, 1.0))
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()  # shutdown() only stops the loop; this closes the socket
            self.metrics_server = None
        for addr in self.addresses:
            if addr.startswith("unix:"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(unix_path(addr))

    async def wait_for_termination(self) -> None:
        """Block until the server stops."""
        if self._server is not None:
            await self._server.wait_for_termination()

    async def __aenter__(self) -> ProcessorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(grace=1.0)


def server_credentials(cert: str, key: str, client_ca: str | None = None) -> grpc.ServerCredentials:
    """TLS credentials from PEM files; with `client_ca`, clients must present a certificate (mTLS)."""
    with open(cert, "rb") as f:
        cert_pem = f.read()
    with open(key, "rb") as f:
        key_pem = f.read()
    ca_pem = None
    if client_ca is not None:
        with open(client_ca, "rb") as f:
            ca_pem = f.read()
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=ca_pem is not None
    )


def channel_credentials(ca: str, cert: str | None = None, key: str | None = None) -> grpc.ChannelCredentials:
    """Client TLS credentials from PEM files; `cert` and `key` add a client certificate (mTLS)."""
    with open(ca, "rb") as f:
        ca_pem = f.read()
    cert_pem = key_pem = None
    if cert is not None and key is not None:
        with open(cert, "rb") as f:
            cert_pem = f.read()
        with open(key, "rb") as f:
            key_pem = f.read()
    return grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)


def unix_path(address: str) -> str:
    """The file of a ``unix:`` address (``unix:///abs`` or ``unix:rel``)."""
    if address.startswith("unix://"):
        return address[len("unix://") :]
    return address[len("unix:") :]
