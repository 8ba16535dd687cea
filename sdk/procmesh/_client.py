"""ProcessorClient: one channel to a sidecar, per-call deadlines, gRPC errors translated
(`errors.translate_rpc_error`, the one mapping from a call's status to a procmesh error)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from procmesh._server import DEFAULT_MAX_MESSAGE_BYTES, SERVICE_NAME
from procmesh.errors import translate_rpc_error
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc

# Keepalive: a sidecar outside the pod sits behind a Service, a NAT or a proxy that drops idle
# connections silently; a ping every 30 s (even with no call in flight) keeps the connection
# alive and finds a dead one within 10 s more, instead of on the next hook call's deadline.
# ProcessorServer permits pings this often (its KEEPALIVE_MIN_PING_INTERVAL_MS is lower).
KEEPALIVE_TIME_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 10_000

# Only unary RPCs may be retried: a retried ProcessOutputStream would replay parts mid-stream.
# Every unary hook is safe to repeat, because a processor gets the run's state with each call
# and returns its effects as data; nothing is applied until the orchestrator reads the answer.
_RESPONSES: dict[str, Any] = {
    m.name: message_factory.GetMessageClass(m.output_type)
    for m in ppb.DESCRIPTOR.services_by_name["ProcessorService"].methods
    if not (m.client_streaming or m.server_streaming)
}
"""Each unary RPC's response class, by method name."""
_UNARY_METHODS = sorted(_RESPONSES)


def _retry_policy(*codes: str) -> dict[str, Any]:
    return {
        "maxAttempts": 3,
        "initialBackoff": "0.05s",
        "maxBackoff": "0.5s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": list(codes),
    }


SERVICE_CONFIG: dict[str, Any] = {
    # round_robin everywhere: over `ipv4:a,b,c` or `dns:///name:port` (a headless Service) it
    # spreads calls over every replica and skips one that is down; over one address or a unix
    # socket it is a single subchannel, so it behaves as pick_first would. pick_first on a
    # name that resolves to several pods would pin every call to the first.
    "loadBalancingConfig": [{"round_robin": {}}],
    "methodConfig": [
        {
            "name": [{"service": SERVICE_NAME, "method": m} for m in _UNARY_METHODS if m != "ExecuteTool"],
            # UNAVAILABLE: unreachable, or a replica starting or draining (NotReadyError);
            # CANCELLED from the server: a call that raced the replica's shutdown, or one its
            # grace ran out on. The retry goes to the next replica; hooks are safe to repeat.
            # Attempts stay inside the call's one deadline.
            "retryPolicy": _retry_policy("UNAVAILABLE", "CANCELLED"),
        },
        {
            # A tool's call the server cancelled may have done part of what the tool does
            # (its grace ran out mid-call), and a tool is not bound to be safe to repeat: only
            # UNAVAILABLE, which a replica not serving yet or any more answers before the tool runs.
            "name": [{"service": SERVICE_NAME, "method": "ExecuteTool"}],
            "retryPolicy": _retry_policy("UNAVAILABLE"),
        },
    ],
}


def channel_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, Any]]:
    """The options of a channel to a sidecar: sizes, keepalive, balancing and retries, reconnects."""
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),  # keep pinging an idle connection
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
        # Ours is the config: a DNS TXT record cannot change balancing or retries.
        ("grpc.service_config_disable_resolution", 1),
        # A restarted sidecar is found again quickly, without hammering one that is down.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]


Metadata = Sequence[tuple[str, str]]
"""gRPC metadata pairs sent with a call."""


class ProcessorClient:
    """A client for one sidecar address.

    The address is any gRPC target: ``host:port``, ``unix:///path.sock``, ``dns:///name:port``
    (every address the name resolves to) or ``ipv4:10.0.0.1:50051,10.0.0.2:50051`` (several
    replicas). Calls are balanced round-robin over the replicas, and unary calls that meet
    UNAVAILABLE, or CANCELLED from the server (not ExecuteTool), are retried (up to 3 attempts
    within the call's deadline; `SERVICE_CONFIG`).

    Args:
        address: The sidecar's address.
        max_message_bytes: Largest request or response accepted.
        credentials: Channel TLS credentials (`channel_credentials()`); plaintext when None.
        server_name: The name to verify in the sidecar's certificate, if not the address's host.
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
        options = channel_options(max_message_bytes)
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self._channel = grpc.aio.secure_channel(address, credentials, options=options)
        self.stub = pgrpc.ProcessorServiceStub(self._channel)
        # Unary calls send bytes (`call`): a request the caller already holds encoded, or in
        # parts (the orchestrator keeps each message's and each RunContext's encoding), goes as is.
        self._unary: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, Any]] = {
            name: self._channel.unary_unary(
                f"/{SERVICE_NAME}/{name}", request_serializer=None, response_deserializer=response.FromString
            )
            for name, response in _RESPONSES.items()
        }
        # The same stream with requests written as bytes already encoded (`open_stream`).
        self._encoded_stream: grpc.aio.StreamStreamMultiCallable[bytes, ppb.ProcessOutputStreamResponse] = (
            self._channel.stream_stream(
                f"/{SERVICE_NAME}/ProcessOutputStream",
                request_serializer=None,
                response_deserializer=ppb.ProcessOutputStreamResponse.FromString,
            )
        )
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def describe(self, timeout: float | None = None) -> ppb.DescribeResponse:
        """The processors the sidecar hosts."""
        response: ppb.DescribeResponse = await self.call("Describe", ppb.DescribeRequest(), timeout)
        return response

    async def call(
        self, method: str, request: Message | bytes, timeout: float | None, metadata: Metadata = ()
    ) -> Any:
        """Call a unary RPC of ProcessorService by name, raising procmesh errors; `request` is the
        request message or its serialized bytes; `metadata` travels with the call (the trace
        context: `procmesh.tracing.metadata`)."""
        data = request if isinstance(request, bytes) else request.SerializeToString()
        try:
            # Fail fast while every replica is down (no wait_for_ready: the failure policy
            # decides, after the retries); the channel keeps reconnecting with backoff, so calls
            # succeed again once one is back.
            return await self._unary[method](data, timeout=timeout, metadata=metadata or None)
        except grpc.aio.AioRpcError as exc:
            raise translate_rpc_error(exc) from exc

    def open_stream(self, timeout: float | None, metadata: Metadata = (), *, encoded: bool = False) -> Any:
        """Open a ProcessOutputStream call (the caller writes batches and reads results); with
        `encoded`, each request is written as the bytes of a serialized
        ``ProcessOutputStreamRequest`` (one encoding can go to several sidecars)."""
        stream = self._encoded_stream if encoded else self.stub.ProcessOutputStream
        return stream(timeout=timeout, metadata=metadata or None)

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
