"""The gRPC API: procmesh.v1.AgentService (Generate, Stream) plus grpc.health.v1 and reflection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any, NoReturn

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.durable import DurableRuns
from procmesh_orchestrator.errors import APICallError, MemoryStoreError, ProcessorFailedError
from procmesh_orchestrator.run import Agent, RunResult
from procmesh_orchestrator.service import _model_gateway
from procmesh_orchestrator.service._auth import Caller, grpc_caller
from procmesh_orchestrator.service._errors import BadRequestError, DurableUnavailableError, ServiceError
from procmesh_orchestrator.service._logs import RateLimitedLog
from procmesh_orchestrator.service._tls import ServerTls
from procmesh_orchestrator.service.api import control
from procmesh_orchestrator.service.api import durable as _durable
from procmesh_orchestrator.service.api.calls import AgentCall, ResumeRequest
from procmesh_orchestrator.service.api.control import LiveRun
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.results import all_calls, all_results
from procmesh_orchestrator.service.grpc.requests import parse_proto
from procmesh_orchestrator.store import DurableRun

log = logging.getLogger(__name__)

AGENT_SERVICE = apb.DESCRIPTOR.services_by_name["AgentService"].full_name
"""``procmesh.v1.AgentService``: also the service name its health status is reported under."""

Context = grpc.aio.ServicerContext[Any, Any]


def result_to_proto(result: RunResult) -> apb.GenerateResponse:
    """A run result as a GenerateResponse."""
    out = apb.GenerateResponse(
        run_id=result.run_id,
        text=result.text,
        finish_reason=result.finish_reason,
        error=result.error or "",
        status=result.status,
        model_id=result.model_id or "",  # the model that answered (a fallback, when one did)
    )
    _suspended_to_proto(result, out.suspended)
    for step in result.steps:
        convert.step_to_proto(step, out.steps.add())
    convert.usage_to_proto(result.usage, out.usage)
    if result.tripwire is not None:
        convert.abort_to_proto(result.tripwire, out.tripwire)
    for message in result.response_messages:
        convert.message_to_proto(message, out.response_messages.add())
    # the reference's result fields, as the HTTP result has them (`result_json`)
    _calls_to_proto(all_calls(result), out.tool_calls)
    for res in all_results(result):
        item = out.tool_results.add(
            tool_call_id=str(res.get("toolCallId", "")),
            tool_name=str(res.get("toolName", "")),
            provider_executed=bool(res.get("providerExecuted", False)),
        )
        item.args.CopyFrom(convert.to_value(res.get("args")))
        item.result.CopyFrom(convert.to_value(res.get("result")))
    convert.usage_to_proto(result.usage, out.total_usage)
    out.trace_id = result.trace_id or ""
    if result.object is not None:
        out.object.CopyFrom(convert.to_value(result.object))
    for violation in result.violations:
        entry = out.violations.add(
            processor_id=str(violation.get("processorId", "")), message=str(violation.get("message", ""))
        )
        if violation.get("detail") is not None:
            entry.detail.CopyFrom(convert.to_value(violation["detail"]))
    return out


def _calls_to_proto(calls: list[dict[str, Any]], out: Any) -> None:
    for call in calls:
        item = out.add(tool_call_id=str(call.get("toolCallId", "")), tool_name=str(call.get("toolName", "")))
        item.args.CopyFrom(convert.to_value(call.get("args")))


def _suspended_to_proto(result: RunResult, out: Any) -> None:
    _calls_to_proto(result.suspended, out)


def _failed_proto(error: BaseException) -> apb.GenerateResponse:
    partial = getattr(error, "result", None)
    out = result_to_proto(partial) if isinstance(partial, RunResult) else apb.GenerateResponse()
    out.finish_reason = "error"
    out.error = str(error)
    out.status = "failed"
    return out


StreamReply = type[apb.StreamResponse] | type[apb.ApproveToolCallResponse] | type[apb.DeclineToolCallResponse]
DurableReply = type[apb.StreamResponse] | type[apb.ObserveResponse]


def run_record_to_proto(record: DurableRun) -> apb.RunRecord:
    """A durable run's record as a RunRecord."""
    return apb.RunRecord(
        run_id=record.run_id,
        agent_id=record.agent_id,
        thread_id=record.thread_id,
        resource_id=record.resource_id,
        status=record.status,
        attempts=record.attempts,
        created_at=record.created_at,
        updated_at=record.updated_at,
        error=record.error,
        cancel_requested=record.cancel_requested,
    )


class _AgentServicer(agrpc.AgentServiceServicer):
    def __init__(self, service: ServiceCore) -> None:
        self._service = service

    async def _refuse(self, context: Context, exc: ServiceError) -> NoReturn:
        self._service.metrics.requests.labels("grpc", exc.grpc_code.name).inc()
        await context.abort(exc.grpc_code, str(exc))

    def _caller(self, context: Context) -> Caller:
        """Check the key; who calls (a @gateway key is refused: the model gateway only)."""
        caller = grpc_caller(self._service.keys, context)
        caller.check_runs_agents()
        return caller

    def _admit(self, request: Any, context: Context) -> tuple[Agent, AgentCall]:
        """Check the key, find the agent, validate the request and take a run slot."""
        service = self._service
        metadata = {
            key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)
        }
        caller = self._caller(context)
        agent = service.agent(request.agent_id)
        call = parse_proto(
            request,
            caller=caller,
            trust=service.trust,
            timeout=context.time_remaining(),  # the caller's deadline bounds the run and its processor calls
            limits=service.limits,
        ).traced(metadata)
        control.admit(service, request.agent_id, call, caller)
        return agent, call

    async def Generate(self, request: apb.GenerateRequest, context: Context) -> apb.GenerateResponse:
        try:
            agent, call = self._admit(request, context)
        except ServiceError as exc:
            await self._refuse(context, exc)
        started = time.perf_counter()
        if _durable.is_durable(self._service, request.agent_id, call):
            return await self._durable_generate(request.agent_id, call, context, started)
        signal = asyncio.Event()
        work = asyncio.ensure_future(agent.generate(call.input, replace(call.options, abort_signal=signal)))
        try:
            try:
                response = result_to_proto(await asyncio.shield(work))
            except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
                response = _failed_proto(exc)  # a store error names the store
            except asyncio.CancelledError:
                # The client cancelled (or its deadline passed): abort the run, so its in-flight
                # processor, model and tool calls are cancelled and the partial result is recorded.
                signal.set()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await work
                log.info("grpc generate agent=%s cancelled by the client", request.agent_id)
                raise
        finally:
            self._service.gate.leave()
        log.info(
            "grpc generate agent=%s run=%s finish=%s %.3fs",
            request.agent_id,
            response.run_id,
            "tripwire" if response.HasField("tripwire") else response.finish_reason,
            time.perf_counter() - started,
        )
        self._service.metrics.requests.labels("grpc", "OK").inc()
        return response

    async def Stream(self, request: apb.StreamRequest, context: Context) -> AsyncIterator[apb.StreamResponse]:
        try:
            agent, call = self._admit(request, context)
        except ServiceError as exc:
            await self._refuse(context, exc)
        if _durable.is_durable(self._service, request.agent_id, call):
            try:
                try:
                    durable, run_id = await _durable.begin(self._service, request.agent_id, call)
                except ServiceError as exc:
                    await self._refuse(context, exc)
                async for reply in self._relay_durable(
                    "stream", durable, run_id, durable.attach(run_id, 0), apb.StreamResponse, context
                ):
                    yield reply
            finally:
                self._service.gate.leave()
            return
        live = control.stream(self._service, request.agent_id, agent, call)
        async for reply in self._relay("stream", live, apb.StreamResponse):
            yield reply

    async def _durable_generate(
        self, agent_id: str, call: AgentCall, context: Context, started: float
    ) -> apb.GenerateResponse:
        """A durable run to its end; a client that cancels leaves it running (observe it)."""
        try:
            try:
                durable, run_id = await _durable.begin(self._service, agent_id, call)
            except ServiceError as exc:
                await self._refuse(context, exc)
            done = await durable.result(run_id)
        finally:
            self._service.gate.leave()
        if done is None:
            context.set_trailing_metadata((("procmesh-run-id", run_id),))
            await self._refuse(
                context,
                DurableUnavailableError(
                    f"durable run {run_id} goes on elsewhere: observe it with Observe(run_id)"
                ),
            )
        log.info(
            "grpc generate agent=%s durable run=%s finish=%s %.3fs",
            agent_id,
            run_id,
            done.finish_reason,
            time.perf_counter() - started,
        )
        self._service.metrics.requests.labels("grpc", "OK").inc()
        return result_to_proto(done)

    async def _relay_durable(
        self,
        kind: str,
        durable: DurableRuns,
        run_id: str,
        events: Any,
        reply: DurableReply,
        context: Context,
    ) -> AsyncIterator[Any]:
        """A durable run's events as `reply` messages with their offsets, then one with its status.
        A client that cancels stops reading only: the run goes on."""
        started = time.perf_counter()
        saw_tripwire = False
        sent = 0
        finished = False
        try:
            try:
                async for offset, chunk in events:
                    saw_tripwire |= chunk.get("type") == "tripwire"
                    sent += 1
                    yield reply(run_id=run_id, chunk=convert.chunk_to_proto(chunk), offset=offset)
            except Exception as exc:  # the log failed mid-way: the client observes again
                log.warning("grpc %s run=%s: event log failed after %d events: %s", kind, run_id, sent, exc)
                await self._refuse(context, DurableUnavailableError(_durable.LOG_CUT))
            end = await _durable.ending(self._service, durable, run_id, saw_tripwire)
            last = reply(run_id=run_id, status=end.status)
            _calls_to_proto(end.suspended, last.suspended)
            finished = True
            yield last
        finally:
            log.info(
                "grpc %s durable run=%s events=%d %s %.3fs",
                kind,
                run_id,
                sent,
                "done" if finished else "left",
                time.perf_counter() - started,
            )
        self._service.metrics.requests.labels("grpc", "OK").inc()

    async def Observe(
        self, request: apb.ObserveRequest, context: Context
    ) -> AsyncIterator[apb.ObserveResponse]:
        service = self._service
        try:
            caller = self._caller(context)
            observed = await control.observe(service, request.run_id, request.offset, caller)
        except ServiceError as exc:
            await self._refuse(context, exc)
        async for reply in self._relay_durable(
            "observe", observed.durable, observed.record.run_id, observed.events, apb.ObserveResponse, context
        ):
            yield reply

    async def ListRuns(self, request: apb.ListRunsRequest, context: Context) -> apb.ListRunsResponse:
        try:
            query = _durable.run_query(
                resource_id=request.resource_id,
                agent_id=request.agent_id,
                status=request.status,
                page=request.page,
                per_page=request.per_page or _durable.DEFAULT_RUNS_PER_PAGE,
                caller=self._caller(context),
            )
            runs, total = await _durable.list_runs(self._service, query)
        except ServiceError as exc:
            await self._refuse(context, exc)
        self._service.metrics.requests.labels("grpc", "OK").inc()
        return apb.ListRunsResponse(runs=[run_record_to_proto(r) for r in runs], total=total)

    async def GetRun(self, request: apb.GetRunRequest, context: Context) -> apb.GetRunResponse:
        try:
            record = await _durable.visible_run(self._service, request.run_id, self._caller(context))
        except ServiceError as exc:
            await self._refuse(context, exc)
        self._service.metrics.requests.labels("grpc", "OK").inc()
        return apb.GetRunResponse(run=run_record_to_proto(record))

    async def CancelRun(self, request: apb.CancelRunRequest, context: Context) -> apb.CancelRunResponse:
        try:
            caller = self._caller(context)
            cancelled, after = await control.cancel_durable(self._service, request.run_id, caller)
        except ServiceError as exc:
            await self._refuse(context, exc)
        self._service.metrics.requests.labels("grpc", "OK").inc()
        return apb.CancelRunResponse(cancelled=cancelled, run=run_record_to_proto(after))

    async def ApproveToolCall(
        self, request: apb.ApproveToolCallRequest, context: Context
    ) -> AsyncIterator[apb.ApproveToolCallResponse]:
        live = await self._resume(request, context, approved=True, reason=None)
        async for reply in self._relay("approve", live, apb.ApproveToolCallResponse):
            yield reply

    async def DeclineToolCall(
        self, request: apb.DeclineToolCallRequest, context: Context
    ) -> AsyncIterator[apb.DeclineToolCallResponse]:
        reason = request.reason or None
        live = await self._resume(request, context, approved=False, reason=reason)
        async for reply in self._relay("decline", live, apb.DeclineToolCallResponse):
            yield reply

    async def _resume(self, request: Any, context: Context, *, approved: bool, reason: str | None) -> LiveRun:
        """Check the key, find the agent, claim the suspended run (NOT_FOUND, ABORTED) and take a slot."""
        service = self._service
        try:
            caller = self._caller(context)
            agent = service.agent(request.agent_id)
            if not request.run_id or not request.tool_call_id:
                raise BadRequestError("give run_id and tool_call_id")
            decision = ResumeRequest(request.run_id, request.tool_call_id, reason, {})
            return await control.resume(
                service, request.agent_id, agent, decision, approved=approved, caller=caller
            )
        except ServiceError as exc:
            await self._refuse(context, exc)

    async def _relay(self, kind: str, live: LiveRun, reply: StreamReply) -> AsyncIterator[Any]:
        """Stream a run's chunks as `reply` messages, then one with its status; a client that
        cancels aborts the run. The run slot is given back at the end."""
        run = live.run
        started = time.perf_counter()
        finished = False
        try:
            async for chunk in run:
                live.see(chunk)
                yield reply(run_id=live.run_id, chunk=convert.chunk_to_proto(chunk))
            result = await run.result()
            last = reply(run_id=live.run_id, status=result.status)
            _suspended_to_proto(result, last.suspended)
            finished = True
            yield last
        finally:
            await live.close(abort=not finished)  # the client cancelled: abort the run (partial result)
            log.info(
                "grpc %s agent=%s run=%s %s %.3fs",
                kind,
                live.agent_id,
                live.run_id,
                "done" if finished else "cancelled",
                time.perf_counter() - started,
            )
        self._service.metrics.requests.labels("grpc", "OK").inc()


def _raw(handler: Any, decode: Any, check: Any, take: Any = None) -> Any:
    """`handler` taking raw bytes: a request that does not decode is INVALID_ARGUMENT, not UNKNOWN.

    grpc decodes before any handler runs and reports a failure as UNKNOWN with an ERROR traceback
    per request; decoding here makes it the contract's INVALID_ARGUMENT and one rate-limited line.
    `check` runs first (the API key), so an unauthenticated caller learns nothing about decoding.
    `take` (AgentService) then takes one of the key's slots (`KeyLimits`), given back at the end.
    """

    async def parse(raw: bytes, context: Context) -> Any:
        await check(context)
        try:
            return decode(raw)
        except Exception as exc:  # DecodeError, RecursionError: whatever the bytes make protobuf do
            _malformed.warning(type(exc).__name__)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed request: it does not decode")

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


class _Guard(grpc.aio.ServerInterceptor):
    """Decode requests ourselves (clear INVALID_ARGUMENT) and put reflection behind the API key."""

    def __init__(self, service: ServiceCore) -> None:
        self._service = service
        self._gateway_check = _model_gateway.access_check(service)

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
            return _raw(handler, handler.request_deserializer, self._check_agent_key, self._take_slot)
        if method.startswith(f"/{_model_gateway.MODEL_SERVICE}/"):
            # the gateway's own access rule (the unix socket, or a key with the gateway role)
            return _raw(handler, handler.request_deserializer, self._gateway_check)
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


_malformed = RateLimitedLog(log, "malformed gRPC request refused")


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
            interceptors=[_Guard(service)],
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
        agrpc.add_AgentServiceServicer_to_server(_AgentServicer(service), self._server)
        _model_gateway.add_model_gateway(service, self._server)  # ModelService: models for processors
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            [
                AGENT_SERVICE,
                _model_gateway.MODEL_SERVICE,
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
