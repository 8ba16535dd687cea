"""Service: the App behind the HTTP and gRPC APIs, with readiness, metrics and a graceful drain."""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import os
import shutil
import signal
import tempfile

from procmesh_orchestrator.app import App, ConfigReloader
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.errors import ServiceStartError
from procmesh_orchestrator.service._auth import ApiKeys
from procmesh_orchestrator.service._logs import RateLimitedLog
from procmesh_orchestrator.service._tls import server_tls
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.grpc.server import GrpcServer
from procmesh_orchestrator.service.http.app import build_http_app
from procmesh_orchestrator.service.http.server import HttpServer
from procmesh_orchestrator.settings import OrchestratorSettings
from procmesh_orchestrator.sidecar_process import ModelGateway

log = logging.getLogger(__name__)
_slow_clients = RateLimitedLog(log, "slow clients cut")


class Service(ServiceCore):
    """The orchestrator as a long-lived service: the `ServiceCore` both APIs serve from, served.

    `start()` connects the App to its sidecars, polls their health, then serves the
    HTTP API (agents, /metrics, /healthz, /readyz) and the gRPC API (AgentService,
    grpc.health.v1). `drain()` is what SIGTERM does: readiness and health go
    NOT_SERVING, new runs are refused, in-flight runs get `drain_grace_seconds` to
    finish. `stop()` then closes everything. As an async context manager, leaving
    drains and stops.

    Args:
        settings: How to serve (ports, keys, limits).
        config: What to serve (sidecars, models, agents).
        app: An App to serve instead of one built from `config` (tests).
    """

    def __init__(self, settings: OrchestratorSettings, config: Config, *, app: App | None = None) -> None:
        super().__init__(settings, config, app=app)
        self.health_listeners.append(self._on_health)
        self._http: HttpServer | None = None
        self._grpc: GrpcServer | None = None
        self._private_dir: str | None = None
        """The private folder of the gateway's socket for our own sidecars, when the port is TLS."""
        self._force = asyncio.Event()

    @property
    def http_port(self) -> int:
        """The bound HTTP port (after `start()`)."""
        assert self._http is not None, "start() first"
        return self._http.port

    @property
    def grpc_port(self) -> int:
        """The bound gRPC port (after `start()`)."""
        assert self._grpc is not None, "start() first"
        return self._grpc.port

    def _slow_client_cut(self) -> None:
        self.metrics.slow_clients_cut.labels("http").inc()
        _slow_clients.warning(
            f"an HTTP client left a response unread for {self.settings.slow_client_seconds:g}s "
            "(PROCMESH_SLOW_CLIENT_SECONDS): connection cut, its run handled as a disconnect"
        )

    async def _on_health(self, serving: bool) -> None:
        if self._grpc is not None and not self.gate.draining:
            await self._grpc.set_serving(serving)

    async def start(self) -> None:
        """Connect to the sidecars, then serve both APIs (stops what started if anything fails)."""
        check_exposure(self.settings)
        try:
            # Bound first: the built-in sidecar the App may start is told the gateway's address
            # (it calls the gateway only during runs, once the server serves).
            tls = server_tls(self.settings)
            socket = self.settings.grpc_socket
            if tls is not None and socket is None:
                # The sidecars this process starts hold no CA for its TLS port: they reach the
                # gateway on a socket in a private (0700) folder instead, as without TLS they may.
                self._private_dir = tempfile.mkdtemp(prefix="procmesh-gateway-")
                socket = os.path.join(self._private_dir, "gateway.sock")
            self._grpc = GrpcServer(
                self, self.settings.grpc_host, self.settings.grpc_port, socket=socket, tls=tls
            )
            await self.app.start(gateway=sidecar_gateway(self.settings, self._grpc.port, self.keys, socket))
            await self.health.poll_once()
            await self._grpc.start()
            await self._grpc.set_serving(self.health.serving)
            self._http = HttpServer(
                build_http_app(self),
                self.settings.http_host,
                self.settings.http_port,
                max_connections=self.settings.max_connections,
                header_timeout=self.settings.header_timeout_seconds,
                slow_client_seconds=self.settings.slow_client_seconds,
                on_slow_client=self._slow_client_cut,
                tls=tls,
            )
            await self._http.start()
            self.health.start()
        except BaseException:
            await self.stop()
            raise
        # What was made to serve (modules, the config, its pipelines, the servers) lives as long as
        # the process: frozen out of the cycle collector's reach, its full collections walk only
        # what runs make (they held the loop 52-179 ms every few seconds of bench P8 before).
        gc.collect()
        gc.freeze()
        log.info(
            "procmesh-orchestrator serving: HTTP %s://%s:%d (/api/agents, /metrics, /healthz, /readyz), "
            "gRPC %s:%d%s%s (procmesh.v1.AgentService, procmesh.v1.ModelService, grpc.health.v1); agents %s",
            "https" if tls is not None else "http",
            self._http.host,
            self._http.port,
            self._grpc.host,
            self._grpc.port,
            " (TLS, client certificates required)" if tls and tls.mutual else " (TLS)" if tls else "",
            f" and unix:{self.settings.grpc_socket}" if self.settings.grpc_socket else "",
            sorted(self.app.agents),
        )

    async def drain(self, grace: float | None = None) -> bool:
        """Refuse new runs, report NOT_SERVING, wait for in-flight runs; True when all finished in time."""
        grace = self.settings.drain_grace_seconds if grace is None else grace
        self.gate.drain()
        if self._grpc is not None:
            await self._grpc.enter_graceful_shutdown()
        log.info("draining: %d run(s) in flight, grace %.1fs", self.gate.active, grace)
        idle = asyncio.create_task(self.gate.wait_idle(grace))
        forced = asyncio.create_task(self._force.wait())
        await asyncio.wait({idle, forced}, return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        drained = idle.done() and idle.result()
        idle.cancel()
        if drained:
            log.info("drained: no run in flight")
        else:
            log.warning("drain ended with %d run(s) in flight; they are cancelled", self.gate.active)
        return drained

    def force(self) -> None:
        """End a drain now (a second SIGTERM/SIGINT)."""
        self._force.set()

    async def stop(self) -> None:
        """Stop both servers (cancelling what still runs), the health poller and the App."""
        if self._http is not None:
            await self._http.stop()
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        await self.health.stop()
        self.trim.cancel()
        await self.app.stop()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None

    async def __aenter__(self) -> Service:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.drain()
        finally:
            await self.stop()


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_exposure(settings: OrchestratorSettings) -> None:
    """Without API keys, serve loopback only unless told otherwise, and say so either way."""
    if settings.api_keys:
        return
    exposed = [h for h in (settings.http_host, settings.grpc_host) if not _loopback(h)]
    if exposed and not settings.allow_unauthenticated:
        raise ServiceStartError(
            f"refusing to serve without API keys on {', '.join(sorted(set(exposed)))}: anyone who reaches "
            "it could run the agents. Set PROCMESH_API_KEYS, bind 127.0.0.1, or pass "
            "--allow-unauthenticated (PROCMESH_ALLOW_UNAUTHENTICATED=true)"
        )
    log.warning(
        "no API keys (PROCMESH_API_KEYS): every client that reaches %s can run the agents",
        "this host" if not exposed else ", ".join(sorted(set(exposed))),
    )


def sidecar_gateway(
    settings: OrchestratorSettings, port: int, keys: ApiKeys, socket: str | None
) -> ModelGateway:
    """The model gateway as a sidecar this orchestrator starts reaches it: the unix socket when
    one is served (no TCP hop), else the gRPC port (an any-address bind on loopback), with a key made
    for it (the gateway role only: no configured key reaches a child process)."""
    if socket:
        address = f"unix://{os.path.abspath(socket)}"
    else:
        host = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "[::]": "[::1]"}.get(
            settings.grpc_host, settings.grpc_host
        )
        address = f"{host}:{port}"
    return ModelGateway(address, keys.sidecar_key())


async def serve(settings: OrchestratorSettings, config: Config) -> None:
    """Serve until SIGTERM or SIGINT, then drain within the grace period and stop."""
    service = Service(settings, config)
    stop = asyncio.Event()

    def on_signal(signum: signal.Signals) -> None:
        if stop.is_set():
            log.warning("%s again: cancelling the runs still in flight", signum.name)
            service.force()
        else:
            log.info("%s: draining", signum.name)
            stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await service.start()
    reloader = None
    if settings.config_file:  # SIGHUP and a change of the file reload it (app._reload)
        reloader = ConfigReloader(
            service.app, settings.config_file, poll_seconds=settings.config_poll_seconds
        )
        reloader.start()
        loop.add_signal_handler(signal.SIGHUP, reloader.request, "SIGHUP")
    try:
        await stop.wait()
        if reloader is not None:
            await reloader.stop()  # a SIGHUP while draining is logged, not applied
        await service.drain()
    finally:
        if reloader is not None:
            await reloader.stop()
        await service.stop()
    log.info("stopped")
