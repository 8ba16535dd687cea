"""An agent's runs over HTTP: generate and stream (plain or durable), approving or declining a
suspended tool call (streamed or to its end), the agent's suspended runs, cancelling a run and
observing a durable one. Each route parses its request and shapes its answer; what it does to the
runs is `api.control`'s."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from procmesh_orchestrator.errors import APICallError, MemoryStoreError, ProcessorFailedError
from procmesh_orchestrator.run import Agent
from procmesh_orchestrator.service._auth import Caller, caller_of
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service._trust import DROPPED_HEADER, dropped_header, report_dropped
from procmesh_orchestrator.service.api import control, durable
from procmesh_orchestrator.service.api.calls import AgentCall, parse_body
from procmesh_orchestrator.service.api.control import LiveRun
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.results import (
    Framing,
    StreamWarnings,
    dumps,
    failed_json,
    result_json,
    wire_chunk,
)
from procmesh_orchestrator.service.api.resume import (
    ResumeParser,
    ResumeRequest,
    parse_approval,
    parse_resume_data,
)
from procmesh_orchestrator.service.api.runs import store_errors, suspended_run_json
from procmesh_orchestrator.service.http import sse
from procmesh_orchestrator.service.http.bodies import (
    EventStreamResponse,
    GatedResponse,
    Release,
    error_response,
    json_response,
    no_release,
    query_int,
    read_body,
    releaser,
    route,
)
from procmesh_orchestrator.service.http.sse import HEARTBEAT, with_heartbeats

log = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]

_SUSPENDED_QUERY = ("threadId", "resourceId", "fromDate", "toDate", "page", "perPage", "requestContext")
"""suspended-runs' filters, and the request context client-js adds (checked, not used: the list
is the caller's resource's, whatever its context)."""


class AgentRoutes:
    """The routes under ``/api/agents/{agent_id}/`` that run, resume, cancel or observe a run."""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    def routes(self) -> list[Route]:
        """The routes, in the order the route table takes them."""
        base = "/api/agents/{agent_id}"
        return [
            route(f"{base}/generate", self.generate, "POST"),
            route(f"{base}/stream", self.stream, "POST"),
            route(f"{base}/approve-tool-call", self._resume(True), "POST"),
            route(f"{base}/decline-tool-call", self._resume(False), "POST"),
            route(f"{base}/approve-tool-call-generate", self._resume_generate(True), "POST"),
            route(f"{base}/decline-tool-call-generate", self._resume_generate(False), "POST"),
            route(f"{base}/resume-stream", self.resume_with_data, "POST"),
            route(f"{base}/suspended-runs", self.suspended_runs, "GET", *_SUSPENDED_QUERY),
            route(f"{base}/runs/{{run_id}}/cancel", self.cancel_run, "POST"),
            route(f"{base}/observe", self.observe, "POST"),
        ]

    async def _admit(self, request: Request) -> tuple[str, Agent, AgentCall]:
        """The agent and the validated call of a generate or stream request, with a run slot taken."""
        core = self.core
        agent_id = request.path_params["agent_id"]
        agent = core.agent(agent_id)
        caller = caller_of(request)
        call = parse_body(
            await read_body(core, request), caller=caller, trust=core.trust, limits=core.limits
        ).traced(request.headers)
        call.drop_undeclared(core.trust, agent.context_schema)
        await control.reserve_run_id(core, agent, call)
        try:
            control.admit(core, agent_id, call, caller)
        except BaseException:
            control.release_run_id(core, call)
            raise
        if call.dropped_context:
            report_dropped(core.metrics.context_dropped, "http", agent_id, call.dropped_context)
        return agent_id, agent, call

    async def generate(self, request: Request) -> Response:
        """``POST /api/agents/{id}/generate``: the run to its end, as the reference's result."""
        agent_id, agent, call = await self._admit(request)
        try:
            return _naming_drops(call, await self._generate(request, agent_id, agent, call))
        finally:
            control.release_run_id(self.core, call)  # the run has ended (or is the store's)

    async def _generate(self, request: Request, agent_id: str, agent: Agent, call: AgentCall) -> Response:
        core = self.core
        release = releaser(core)
        try:
            started = time.perf_counter()
            if durable.is_durable(core, agent_id, call):
                manager, run_id = await durable.begin(core, agent_id, call)
                done = await manager.result(run_id)  # its warnings noted where it ends (`ServiceCore`)
                if done is None:  # it stopped on this replica (drain, lost lease): observe it
                    await release()
                    log.info("generate agent=%s durable run=%s left this replica", agent_id, run_id)
                    return error_response(
                        503, "the durable run goes on elsewhere: observe it with its runId", runId=run_id
                    )
                body = result_json(done, call.warnings)
                log.info(
                    "generate agent=%s durable run=%s finish=%s %.3fs",
                    agent_id,
                    run_id,
                    body["finishReason"],
                    time.perf_counter() - started,
                )
                return GatedResponse(body, release)
            try:  # the client leaving aborts the run as it aborts a stream's
                done = await control.generate(core, agent_id, agent, call, self._client_gone(request))
                body = result_json(done, call.warnings)
            except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
                # a failed run, not a failed request (a store error names the store)
                body = failed_json(exc, call.warnings)
            log.info(
                "generate agent=%s run=%s finish=%s %.3fs",
                agent_id,
                body["runId"],
                "tripwire" if body["tripwire"] else body["finishReason"],
                time.perf_counter() - started,
            )
        except BaseException:
            await release()
            raise
        return GatedResponse(body, release)

    def _client_gone(self, request: Request) -> Awaitable[object]:
        """What aborts a generate: its client leaving, with ``abort_on_disconnect`` (else nothing:
        the run finishes, its answer unsent)."""
        if self.core.settings.abort_on_disconnect:
            return _disconnected(request)
        return asyncio.Event().wait()  # never set

    async def stream(self, request: Request) -> Response:
        """``POST /api/agents/{id}/stream``: the run's chunks as server-sent events."""
        agent_id, agent, call = await self._admit(request)
        return _naming_drops(call, await self._stream(agent_id, agent, call))

    async def _stream(self, agent_id: str, agent: Agent, call: AgentCall) -> Response:
        core = self.core
        if durable.is_durable(core, agent_id, call):
            try:
                manager, run_id = await durable.begin(core, agent_id, call)
            except BaseException:
                core.gate.leave()
                raise
            finally:
                control.release_run_id(core, call)  # the store has the run (or none started)
            # A client that leaves does not abort the run: it observes it again from its last id.
            events = sse.durable_events(
                run_id,
                manager.attach(run_id, 0),
                "stream",
                core.settings.sse_heartbeat_seconds,
                StreamWarnings(call.warnings),
            )
            return EventStreamResponse(events, releaser(core), {"X-Run-Id": run_id})
        return self._streamed(control.stream(core, agent_id, agent, call))

    async def _decision(
        self, request: Request, parse: ResumeParser
    ) -> tuple[str, Agent, ResumeRequest, Caller]:
        core = self.core
        agent_id = request.path_params["agent_id"]
        agent = core.agent(agent_id)
        caller = caller_of(request)
        decision = parse(await read_body(core, request), caller=caller, trust=core.trust, limits=core.limits)
        return agent_id, agent, decision, caller

    async def resume_with_data(self, request: Request) -> Response:
        """``resume-stream``: a run whose tool suspended itself goes on with the caller's
        ``resumeData`` (the tool runs again and sees it), streamed."""
        agent_id, agent, decision, caller = await self._decision(request, parse_resume_data)
        live = await control.resume(self.core, agent_id, agent, decision, approved=True, caller=caller)
        return self._streamed(live)

    def _resume(self, approved: bool) -> Endpoint:
        """``approve-tool-call`` / ``decline-tool-call``: the resumed run, streamed."""

        async def resume(request: Request) -> Response:
            agent_id, agent, decision, caller = await self._decision(request, parse_approval(approved))
            live = await control.resume(
                self.core, agent_id, agent, decision, approved=approved, caller=caller
            )
            return self._streamed(live)

        return resume

    def _resume_generate(self, approved: bool) -> Endpoint:
        """``approve-tool-call-generate`` / ``decline-tool-call-generate``: the resumed run to its end."""

        async def resume(request: Request) -> Response:
            agent_id, agent, decision, caller = await self._decision(request, parse_approval(approved))
            self.core.gate.enter()
            release = releaser(self.core)
            try:
                try:
                    gone = self._client_gone(request)  # as a generate's client leaving aborts it
                    done = await control.resume_generate(
                        self.core,
                        agent_id,
                        agent,
                        decision,
                        approved=approved,
                        caller=caller,
                        client_gone=gone,
                    )
                    body = result_json(done)
                except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
                    body = failed_json(exc)
                log.info(
                    "%s agent=%s run=%s finish=%s",
                    "approve" if approved else "decline",
                    agent_id,
                    body["runId"],
                    body["finishReason"],
                )
            except BaseException:
                await release()
                raise
            return GatedResponse(body, release)

        return resume

    async def suspended_runs(self, request: Request) -> Response:
        """``GET /api/agents/{id}/suspended-runs``: one page, within the caller's resource."""
        agent_id = request.path_params["agent_id"]
        agent = self.core.agent(agent_id)
        query = request.query_params
        caller = caller_of(request)
        resource = query.get("resourceId")
        if not caller.operator:
            if resource and resource != caller.resource:
                raise BadRequestError("resourceId: this API key is bound to another resource")
            resource = caller.resource or ""
        page = query_int(query.get("page"), "page", 0, 0)
        per_page = query_int(query.get("perPage"), "perPage", 20, 1)
        if agent.spec.store is None:
            return json_response({"runs": [], "total": 0})
        with store_errors():
            store = await agent.spec.store()
            runs, total = await store.list_suspended(
                agent_id,
                thread_id=query.get("threadId"),
                resource_id=resource,
                from_date=query.get("fromDate"),
                to_date=query.get("toDate"),
                page=page,
                per_page=per_page,
            )
        return json_response({"runs": [suspended_run_json(r) for r in runs], "total": total})

    async def cancel_run(self, request: Request) -> Response:
        """``POST /api/agents/{id}/runs/{run_id}/cancel``: a durable run, or one streaming here."""
        agent_id, run_id = request.path_params["agent_id"], request.path_params["run_id"]
        await control.cancel_run(self.core, agent_id, run_id, caller_of(request))
        return json_response({"cancelled": True})

    async def observe(self, request: Request) -> Response:
        """``POST /api/agents/{id}/observe``: a durable run's events from an offset (or after
        ``Last-Event-ID``)."""
        core = self.core
        agent_id = request.path_params["agent_id"]
        core.agent(agent_id)
        run_id, offset = sse.parse_observe(
            await read_body(core, request), request.headers.get("last-event-id")
        )
        observed = await control.observe(core, run_id, offset, caller_of(request), agent_id=agent_id)
        return EventStreamResponse(
            sse.durable_events(
                run_id, observed.events, "observe", core.settings.sse_heartbeat_seconds, StreamWarnings()
            ),
            no_release,
            {"X-Run-Id": run_id},
        )

    def _streamed(self, live: LiveRun) -> Response:
        return EventStreamResponse(_events(self.core, live), _stream_releaser(self.core, live))


async def _events(core: ServiceCore, live: LiveRun) -> AsyncIterator[bytes]:
    """``data: <chunk>`` per chunk (``runId`` and ``from`` added), then ``data: [DONE]``; a
    ``: ping`` comment line whenever nothing was sent for ``sse_heartbeat_seconds``."""
    run, agent_id = live.run, live.agent_id
    run_id = ""
    started = time.perf_counter()
    finish = "unknown"
    every = core.settings.sse_heartbeat_seconds
    framing = Framing()
    async for chunk in with_heartbeats(aiter(run), every):
        if chunk is None:
            yield HEARTBEAT
            continue
        live.see(chunk)
        run_id = live.run_id
        kind = chunk.get("type")
        if kind == "finish":
            finish = str((chunk.get("payload") or {}).get("finishReason", finish))
        elif kind in ("tripwire", "abort"):
            finish = kind
        for framed in framing.frame(chunk):
            yield f"data: {dumps(wire_chunk(framed, run_id, live.warnings))}\n\n".encode()
    ending = framing.close()
    try:
        await run.result()
    except Exception:
        log.exception("stream run %s of agent %s failed unexpectedly", run_id, agent_id)
        ending.append({"type": "error", "payload": {"message": "internal error"}})
        finish = "internal-error"
    for chunk in ending:
        yield f"data: {dumps(wire_chunk(chunk, run_id))}\n\n".encode()
    log.info(
        "stream agent=%s run=%s finish=%s %.3fs", agent_id, run_id, finish, time.perf_counter() - started
    )
    yield b"data: [DONE]\n\n"


def _stream_releaser(core: ServiceCore, live: LiveRun) -> Release:
    """Give a streamed run's slot back once it is sent or its client left: a run still going is
    aborted, or, with ``abort_on_disconnect`` off, finishes in the background first."""

    async def release() -> None:
        if core.settings.abort_on_disconnect:
            await live.close(abort=True)
        else:
            core.spawn(live.close(abort=False))

    return release


async def _disconnected(request: Request) -> None:
    """Return once the client of a request whose body was read has gone (uvicorn's receive then
    answers ``http.disconnect``; until then it waits)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _naming_drops(call: AgentCall, response: Response) -> Response:
    """`response` naming the request-context keys the call dropped (a stream's headers go before
    its first event, so this is set before the response starts)."""
    if call.dropped_context:
        response.headers[DROPPED_HEADER] = dropped_header(call.dropped_context)
    return response
