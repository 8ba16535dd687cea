"""The gRPC server's interceptor: requests decoded by us (a clear INVALID_ARGUMENT, not UNKNOWN),
the API key checked before decoding, AgentService's per-key slots, the model gateway's access
rule, and reflection behind the API key."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc_reflection.v1alpha import reflection

from procmesh_orchestrator.service._auth import grpc_caller
from procmesh_orchestrator.service._errors import ServiceError
from procmesh_orchestrator.service._logs import RateLimitedLog
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.grpc import model_gateway
from procmesh_orchestrator.service.grpc.gateway_policy import access_check
from procmesh_orchestrator.service.grpc.known_fields import unknown_fields_of
from procmesh_orchestrator.service.grpc.servicer import AGENT_SERVICE, Context

log = logging.getLogger(__name__)
_malformed = RateLimitedLog(log, "malformed gRPC request refused")


def _raw(handler: Any, decode: Any, check: Any, take: Any = None, *, strict: bool = False) -> Any:
    """`handler` taking raw bytes: a request that does not decode is INVALID_ARGUMENT, not UNKNOWN.

    grpc decodes before any handler runs and reports a failure as UNKNOWN with an ERROR traceback
    per request; decoding here makes it the contract's INVALID_ARGUMENT and one rate-limited line.
    `check` runs first (the API key), so an unauthenticated caller learns nothing about decoding.
    `take` (AgentService) then takes one of the key's slots (`KeyLimits`), given back at the end.
    `strict` (AgentService, the model gateway): a request holding fields this contract lacks is
    INVALID_ARGUMENT naming them (`known_fields`), never run without them.
    """

    async def parse(raw: bytes, context: Context) -> Any:
        await check(context)
        try:
            request = decode(raw)
        except Exception as exc:  # DecodeError, RecursionError: whatever the bytes make protobuf do
            _malformed.warning(type(exc).__name__)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed request: it does not decode")
        if strict and (unknown := unknown_fields_of(request, raw, decode)):
            name = request.DESCRIPTOR.name
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{name} has fields this server's procmesh.v1 does not know: {', '.join(unknown[:10])} "
                "(a newer client's: upgrade the orchestrator, or leave them out)",
            )
        return request

    if handler.unary_unary is not None:
        unary: Any = handler.unary_unary

        async def unary_unary(raw: bytes, context: Context) -> Any:
            request = await parse(raw, context)
            give_back = await take(context) if take is not None else _nothing
            try:
                return await unary(request, context)
            finally:
                give_back()

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, response_serializer=handler.response_serializer
        )
    if handler.unary_stream is not None:
        streaming: Any = handler.unary_stream

        async def unary_stream(raw: bytes, context: Context) -> AsyncIterator[Any]:
            request = await parse(raw, context)
            give_back = await take(context) if take is not None else _nothing
            try:
                async for item in streaming(request, context):
                    yield item
            finally:
                give_back()

        return grpc.unary_stream_rpc_method_handler(
            unary_stream, response_serializer=handler.response_serializer
        )
    return handler  # reflection's bidirectional stream: decoded by grpc, guarded by the key check


def _nothing() -> None:
    """No slot to give back."""


class Guard(grpc.aio.ServerInterceptor):
    """Decode requests ourselves (clear INVALID_ARGUMENT) and put reflection behind the API key."""

    def __init__(self, service: ServiceCore) -> None:
        self._service = service
        self._gateway_check = access_check(service)

    async def _check_key(self, context: Context) -> None:
        try:
            grpc_caller(self._service.keys, context)
        except ServiceError as exc:
            await context.abort(exc.grpc_code, str(exc))

    async def _check_agent_key(self, context: Context) -> None:
        """The key check of AgentService: a @gateway key may call the model gateway only."""
        try:
            grpc_caller(self._service.keys, context).check_runs_agents()
        except ServiceError as exc:
            await context.abort(exc.grpc_code, str(exc))

    async def _take_slot(self, context: Context) -> Callable[[], None]:
        """One of the key's in-flight slots (RESOURCE_EXHAUSTED naming the limit when none is free)."""
        try:
            return self._service.key_limits.take(grpc_caller(self._service.keys, context))
        except ServiceError as exc:
            self._service.metrics.requests.labels("grpc", exc.grpc_code.name).inc()
            await context.abort(exc.grpc_code, str(exc))

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method or ""
        if method.startswith(f"/{reflection.SERVICE_NAME}/"):
            return self._reflection(handler)
        if handler.request_deserializer is None:
            return handler
        if method.startswith(f"/{AGENT_SERVICE}/"):
            deserialize = handler.request_deserializer
            return _raw(handler, deserialize, self._check_agent_key, self._take_slot, strict=True)
        if method.startswith(f"/{model_gateway.MODEL_SERVICE}/"):
            # the gateway's own access rule (the unix socket, or a key with the gateway role); a
            # model call holding fields this contract lacks is refused as AgentService's is
            return _raw(handler, handler.request_deserializer, self._gateway_check, strict=True)
        return handler

    def _reflection(self, handler: Any) -> Any:
        if not self._service.settings.api_keys or handler.stream_stream is None:
            return handler
        stream: Any = handler.stream_stream
        check = self._check_key

        async def guarded(requests: Any, context: Context) -> AsyncIterator[Any]:
            await check(context)
            async for item in stream(requests, context):
                yield item

        return grpc.stream_stream_rpc_method_handler(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
