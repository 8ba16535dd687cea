"""The orchestrator's gRPC server: AgentService, the model gateway (ModelService), grpc.health.v1
and reflection, on a TCP port (TLS when configured) and optionally a unix socket."""

from __future__ import annotations

import os
import stat

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.service._tls import ServerTls
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.grpc import model_gateway
from procmesh_orchestrator.service.grpc.guard import Guard
from procmesh_orchestrator.service.grpc.servicer import AGENT_SERVICE, AgentServicer


class GrpcServer:
    """The orchestrator's gRPC server: AgentService, ModelService, grpc.health.v1 and reflection,
    on ``host:port`` and, given a `socket` path, on that unix socket too (the pod's sidecars)."""

    def __init__(
        self,
        service: ServiceCore,
        host: str,
        port: int,
        *,
        socket: str | None = None,
        tls: ServerTls | None = None,
    ) -> None:
        self.health = health_aio.HealthServicer()
        self._server = grpc.aio.server(
            interceptors=[Guard(service)],
            options=[
                ("grpc.max_receive_message_length", service.settings.max_request_bytes),
                ("grpc.so_reuseport", 0),
                # A GOAWAY after about 5 minutes (gRPC adds jitter): clients reconnect through
                # the Service, so pods an autoscaler adds get their share of calls. Runs in
                # flight, streams included, get 10 minutes more on the old connection.
                ("grpc.max_connection_age_ms", 5 * 60_000),
                ("grpc.max_connection_age_grace_ms", 10 * 60_000),
                # Clients that keep idle connections alive with pings (every 30 s and up) are
                # answered, not sent GOAWAY "too_many_pings".
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            ],
        )
        agrpc.add_AgentServiceServicer_to_server(AgentServicer(service), self._server)
        model_gateway.add_model_gateway(service, self._server)  # ModelService: models for processors
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            [
                AGENT_SERVICE,
                model_gateway.MODEL_SERVICE,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self._server,
        )
        self.host = host
        try:
            address = f"{host}:{port}"
            self.port = (
                self._server.add_secure_port(address, tls.grpc_credentials())
                if tls is not None
                else self._server.add_insecure_port(address)
            )
        except RuntimeError as exc:  # grpc reports a failed bind this way
            raise OSError(f"cannot bind the gRPC API to {host}:{port}: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot bind the gRPC API to {host}:{port}")
        if socket is not None:
            _bind_unix(self._server, socket)

    async def set_serving(self, serving: bool) -> None:
        """Report SERVING or NOT_SERVING for the server ("") and AgentService."""
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", AGENT_SERVICE):
            await self.health.set(name, status)

    async def start(self) -> None:
        """Start serving (health starts NOT_SERVING until the first sidecar poll says otherwise)."""
        await self.set_serving(False)
        await self._server.start()

    async def enter_graceful_shutdown(self) -> None:
        """NOT_SERVING from now on, whatever the sidecars say."""
        await self.health.enter_graceful_shutdown()

    async def stop(self, grace: float) -> None:
        """Stop; RPCs still running after `grace` seconds are cancelled."""
        await self._server.stop(grace)


def gateway_server(service: ServiceCore, socket: str) -> grpc.aio.Server:
    """ModelService alone, behind the same guard, on the unix socket `socket`: the model gateway of
    a replay's candidate (`procmesh replay`), which serves its sidecars and no agent."""
    server = grpc.aio.server(interceptors=[Guard(service)])
    model_gateway.add_model_gateway(service, server)
    _bind_unix(server, socket)
    return server


def _bind_unix(server: grpc.aio.Server, path: str) -> None:
    """Listen on the unix socket `path` as well; a stale socket file (a crashed process's) goes."""
    if os.path.exists(path):
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            raise OSError(f"cannot bind the gRPC API to unix:{path}: the path exists and is not a socket")
        os.unlink(path)
    try:
        bound = server.add_insecure_port(f"unix:{path}")
    except RuntimeError as exc:
        raise OSError(f"cannot bind the gRPC API to unix:{path}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot bind the gRPC API to unix:{path}")
