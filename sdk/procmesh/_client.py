"""ProcessorClient: one channel to a sidecar, per-call deadlines, gRPC errors translated once."""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh._server import DEFAULT_MAX_MESSAGE_BYTES, SERVICE_NAME
from procmesh.errors import ProcmeshError, error_for_status
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc


def translate_rpc_error(exc: grpc.aio.AioRpcError) -> ProcmeshError:
    """The procmesh error for a failed call (the one place grpc errors are mapped)."""
    return error_for_status(exc.code(), exc.details() or exc.code().name)


class ProcessorClient:
    """A client for one sidecar address (``host:port`` or ``unix:///path.sock``).

    Args:
        address: The sidecar's address.
        max_message_bytes: Largest request or response accepted.
    """

    def __init__(
        self,
        address: str,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str | None = None,
    ) -> None:
        self.address = address
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.enable_retries", 0),
            # A restarted sidecar is found again quickly, without hammering one that is down.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self._channel = grpc.aio.secure_channel(address, credentials, options=options)
        self.stub = pgrpc.ProcessorServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def describe(self, timeout: float | None = None) -> ppb.DescribeResponse:
        """The processors the sidecar hosts."""
        response: ppb.DescribeResponse = await self.call("Describe", ppb.DescribeRequest(), timeout)
        return response

    async def call(self, method: str, request: Any, timeout: float | None) -> Any:
        """Call a unary RPC of ProcessorService by name, raising procmesh errors."""
        try:
            # Fail fast while a sidecar is down (the failure policy decides); the channel keeps
            # reconnecting with backoff, so calls succeed again once it is back.
            return await getattr(self.stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise translate_rpc_error(exc) from exc

    def open_stream(self, timeout: float | None) -> Any:
        """Open a ProcessOutputStream call (the caller writes batches and reads results)."""
        return self.stub.ProcessOutputStream(timeout=timeout)

    async def health(self, timeout: float | None = 1.0) -> str:
        """The sidecar's health status name (``SERVING``, ``NOT_SERVING``, ...)."""
        try:
            resp = await self._health.Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise translate_rpc_error(exc) from exc
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()

    async def __aenter__(self) -> ProcessorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
