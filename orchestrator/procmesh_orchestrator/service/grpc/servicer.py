"""procmesh.v1.AgentService: Generate and Stream (plain or durable), ApproveToolCall and
DeclineToolCall, Observe, ListRuns, GetRun, CancelRun, GetWorkingMemory, UpdateWorkingMemory and
GetRunDecisions.
Each RPC parses its request and shapes its answer; what it does to the runs is `api.control`'s
(the working memory's `grpc.memory`), as for the HTTP routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, NoReturn

import grpc

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.durable import DurableRuns
from procmesh_orchestrator.errors import APICallError, MemoryStoreError, ProcessorFailedError
from procmesh_orchestrator.run import Agent
from procmesh_orchestrator.run.hooks import Resumed
from procmesh_orchestrator.service._auth import Caller, grpc_caller
from procmesh_orchestrator.service._errors import BadRequestError, DurableUnavailableError, ServiceError
from procmesh_orchestrator.service._trust import DROPPED_HEADER, dropped_header, report_dropped
from procmesh_orchestrator.service.api import control, decisions
from procmesh_orchestrator.service.api import durable as _durable
from procmesh_orchestrator.service.api.calls import AgentCall
from procmesh_orchestrator.service.api.control import LiveRun
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.results import StreamWarnings
from procmesh_orchestrator.service.api.resume import ResumeRequest
from procmesh_orchestrator.service.grpc import memory
from procmesh_orchestrator.service.grpc.requests import parse_proto
from procmesh_orchestrator.service.grpc.responses import (
    calls_to_proto,
    decision_to_proto,
    failed_proto,
    result_to_proto,
    run_record_to_proto,
    suspended_to_proto,
    warnings_to_proto,
)

log = logging.getLogger(__name__)

AGENT_SERVICE = apb.DESCRIPTOR.services_by_name["AgentService"].full_name
"""``procmesh.v1.AgentService``: also the service name its health status is reported under."""

Context = grpc.aio.ServicerContext[Any, Any]

StreamReply = (
    type[apb.StreamResponse]
    | type[apb.ApproveToolCallResponse]
    | type[apb.DeclineToolCallResponse]
    | type[apb.ResumeToolCallResponse]
)
DurableReply = type[apb.StreamResponse] | type[apb.ObserveResponse]


class AgentServicer(agrpc.AgentServiceServicer):
    """procmesh.v1.AgentService: runs, approvals and durable runs, over the API layer."""

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
        call.drop_undeclared(service.trust, agent.context_schema)
        control.admit(service, request.agent_id, call, caller)
        return agent, call

    async def _admitted(self, request: Any, context: Context) -> tuple[Agent, AgentCall]:
        """`_admit`, or the call refused; request-context keys it dropped are named in the initial
        metadata (sent now, before any reply), a WARNING and the counter."""
        try:
            agent, call = self._admit(request, context)
        except ServiceError as exc:
            await self._refuse(context, exc)
        if call.dropped_context:
            try:
                await context.send_initial_metadata(
                    ((DROPPED_HEADER.lower(), dropped_header(call.dropped_context)),)
                )
            except BaseException:
                self._service.gate.leave()  # the slot `_admit` took: no run will release it
                raise
            counter = self._service.metrics.context_dropped
            report_dropped(counter, "grpc", request.agent_id, call.dropped_context)
        return agent, call

    async def Generate(self, request: apb.GenerateRequest, context: Context) -> apb.GenerateResponse:
        agent, call = await self._admitted(request, context)
        started = time.perf_counter()
        if _durable.is_durable(self._service, request.agent_id, call):
            return await self._durable_generate(request.agent_id, call, context, started)
        signal = asyncio.Event()
        run = agent.generate(call.input, replace(call.options, abort_signal=signal))
        work = asyncio.ensure_future(control.finished(self._service, request.agent_id, run))
        try:
            try:
                done = await asyncio.shield(work)
                response = result_to_proto(done, call.warnings)
            except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
                response = failed_proto(exc, call.warnings)  # a store error names the store
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
        agent, call = await self._admitted(request, context)
        if _durable.is_durable(self._service, request.agent_id, call):
            try:
                try:
                    durable, run_id = await _durable.begin(self._service, request.agent_id, call)
                except ServiceError as exc:
                    await self._refuse(context, exc)
                events = durable.attach(run_id, 0)
                warned = StreamWarnings(call.warnings)  # the last message's, as a plain stream's
                relay = self._relay_durable(
                    "stream", durable, run_id, events, apb.StreamResponse, context, warned
                )
                async for reply in relay:
                    if not reply.HasField("chunk"):  # the last message: the run's warnings
                        warnings_to_proto(warned.all, reply.warnings)
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
            done = await durable.result(run_id)  # its warnings noted where it ends (`ServiceCore`)
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
        return result_to_proto(done, call.warnings)

    async def _relay_durable(
        self,
        kind: str,
        durable: DurableRuns,
        run_id: str,
        events: Any,
        reply: DurableReply,
        context: Context,
        warnings: StreamWarnings | None = None,
    ) -> AsyncIterator[Any]:
        """A durable run's events as `reply` messages with their offsets, then one with its status;
        `warnings` (a stream's: an observer is not the caller) sees each chunk. A client that
        cancels stops reading only: the run goes on."""
        started = time.perf_counter()
        saw_tripwire = False
        sent = 0
        finished = False
        try:
            try:
                async for offset, chunk in events:
                    saw_tripwire |= chunk.get("type") == "tripwire"
                    if warnings is not None:
                        warnings.see(chunk)
                    sent += 1
                    yield reply(run_id=run_id, chunk=convert.chunk_to_proto(chunk), offset=offset)
            except Exception as exc:  # the log failed mid-way: the client observes again
                log.warning("grpc %s run=%s: event log failed after %d events: %s", kind, run_id, sent, exc)
                await self._refuse(context, DurableUnavailableError(_durable.LOG_CUT))
            end = await _durable.ending(self._service, durable, run_id, saw_tripwire)
            last = reply(run_id=run_id, status=end.status)
            calls_to_proto(end.suspended, last.suspended)
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

    async def GetRunDecisions(
        self, request: apb.GetRunDecisionsRequest, context: Context
    ) -> apb.GetRunDecisionsResponse:
        try:
            found = await decisions.run_decisions(self._service, request.run_id, self._caller(context))
        except ServiceError as exc:
            await self._refuse(context, exc)
        self._service.metrics.requests.labels("grpc", "OK").inc()
        return apb.GetRunDecisionsResponse(
            run_id=request.run_id, decisions=[decision_to_proto(d) for d in found]
        )

    async def GetWorkingMemory(
        self, request: apb.GetWorkingMemoryRequest, context: Context
    ) -> apb.GetWorkingMemoryResponse:
        try:
            reply = await memory.get_working_memory(self._service, request, self._caller(context))
        except ServiceError as exc:
            await self._refuse(context, exc)
        self._service.metrics.requests.labels("grpc", "OK").inc()
        return reply

    async def UpdateWorkingMemory(
        self, request: apb.UpdateWorkingMemoryRequest, context: Context
    ) -> apb.UpdateWorkingMemoryResponse:
        try:
            reply = await memory.update_working_memory(self._service, request, self._caller(context))
        except ServiceError as exc:
            await self._refuse(context, exc)
        self._service.metrics.requests.labels("grpc", "OK").inc()
        return reply

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

    async def ResumeToolCall(
        self, request: apb.ResumeToolCallRequest, context: Context
    ) -> AsyncIterator[apb.ResumeToolCallResponse]:
        data = Resumed(convert.from_value(request.resume_data), None)
        live = await self._resume(request, context, approved=True, reason=None, data=data)
        async for reply in self._relay("resume", live, apb.ResumeToolCallResponse):
            yield reply

    async def _resume(
        self,
        request: Any,
        context: Context,
        *,
        approved: bool,
        reason: str | None,
        data: Resumed | None = None,
    ) -> LiveRun:
        """Check the key, find the agent, claim the suspended run (NOT_FOUND, ABORTED) and take a
        slot; with `data` (ResumeToolCall) the call goes on with it, else approved or declined."""
        service = self._service
        try:
            caller = self._caller(context)
            agent = service.agent(request.agent_id)
            if not request.run_id or (data is None and not request.tool_call_id):
                raise BadRequestError("give run_id and tool_call_id")
            # ResumeToolCall without a call id resumes the run's only awaited call (the store checks)
            decision = ResumeRequest(request.run_id, request.tool_call_id or None, reason, {}, data)
            return await control.resume(
                service, request.agent_id, agent, decision, approved=approved, caller=caller
            )
        except ServiceError as exc:
            await self._refuse(context, exc)

    async def _relay(self, kind: str, live: LiveRun, reply: StreamReply) -> AsyncIterator[Any]:
        """Stream a run's chunks as `reply` messages, then one with its status and its warnings
        (`LiveRun.warnings`: the call's own, then its model calls'); a client that cancels aborts
        the run. The run slot is given back at the end."""
        run = live.run
        started = time.perf_counter()
        finished = False
        try:
            async for chunk in run:
                live.see(chunk)
                yield reply(run_id=live.run_id, chunk=convert.chunk_to_proto(chunk))
            result = await run.result()
            last = reply(run_id=live.run_id, status=result.status)
            suspended_to_proto(result, last.suspended)
            warnings_to_proto(live.warnings.all, last.warnings)
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
