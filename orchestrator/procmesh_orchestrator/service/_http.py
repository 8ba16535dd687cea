"""The HTTP API: the reference server's agent routes, /metrics and the probes (Starlette on uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from prometheus_client.exposition import choose_encoder
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from procmesh_orchestrator.errors import APICallError, MemoryStoreError, ProcessorFailedError
from procmesh_orchestrator.run import Agent
from procmesh_orchestrator.service._auth import Caller, caller_of
from procmesh_orchestrator.service._catalog_api import catalog_routes, unsupported_routes
from procmesh_orchestrator.service._errors import (
    BadRequestError,
    ClientGoneError,
    RequestTimeoutError,
    ServiceError,
    TooLargeError,
    UnsupportedMediaTypeError,
)
from procmesh_orchestrator.service._logs import RateLimitedLog
from procmesh_orchestrator.service._memory_api import memory_routes
from procmesh_orchestrator.service._sse import HEARTBEAT, with_heartbeats
from procmesh_orchestrator.service.api import control
from procmesh_orchestrator.service.api import durable as _durable
from procmesh_orchestrator.service.api.calls import AgentCall, ResumeRequest, parse_body, parse_resume
from procmesh_orchestrator.service.api.control import LiveRun
from procmesh_orchestrator.service.api.core import ServiceCore
from procmesh_orchestrator.service.api.results import dumps, failed_json, result_json, wire_chunk
from procmesh_orchestrator.service.api.runs import resume_generate, store_errors, suspended_run_json
from procmesh_orchestrator.store import MAX_PAGE

log = logging.getLogger(__name__)

Release = Callable[[], Awaitable[None]]


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response (compact, UTF-8)."""
    return Response(dumps(body), status_code=status, media_type="application/json", headers=headers)


def error_response(status: int, message: str, **extra: Any) -> Response:
    """The error shape of the reference server: ``{"error": message}``."""
    headers = {"WWW-Authenticate": 'Bearer realm="procmesh"'} if status == 401 else None
    return json_response({"error": message, **extra}, status, headers)


class _GatedResponse(Response):
    """A response that releases its run slot once it is sent (or the client went away)."""

    def __init__(self, body: Any, release: Release) -> None:
        super().__init__(dumps(body), media_type="application/json")
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


class _EventStreamResponse(StreamingResponse):
    """Server-sent events of one run; `release` runs once it is sent or the client left."""

    def __init__(
        self, events: AsyncIterator[bytes], release: Release, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


async def _events(core: ServiceCore, live: LiveRun) -> AsyncIterator[bytes]:
    """``data: <chunk>`` per chunk (``runId`` and ``from`` added), then ``data: [DONE]``; a
    ``: ping`` comment line whenever nothing was sent for ``sse_heartbeat_seconds``."""
    run, agent_id = live.run, live.agent_id
    run_id = ""
    started = time.perf_counter()
    finish = "unknown"
    every = core.settings.sse_heartbeat_seconds
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
        yield f"data: {dumps(wire_chunk(chunk, run_id))}\n\n".encode()
    try:
        await run.result()
    except Exception:
        log.exception("stream run %s of agent %s failed unexpectedly", run_id, agent_id)
        error = {"type": "error", "payload": {"message": "internal error"}}
        yield f"data: {dumps(wire_chunk(error, run_id))}\n\n".encode()
        finish = "internal-error"
    log.info(
        "stream agent=%s run=%s finish=%s %.3fs", agent_id, run_id, finish, time.perf_counter() - started
    )
    yield b"data: [DONE]\n\n"


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


class _Boundary:
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


async def _read_json(request: Request, limit: int, timeout: float) -> Any:
    """The body as JSON, refusing more than `limit` bytes before or while reading it, or a body
    that takes longer than `timeout` seconds to arrive."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise UnsupportedMediaTypeError(
            f"send the body as Content-Type: application/json (got {media_type[:64] or 'none'!r})"
        )
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise TooLargeError(f"request body of {int(length)} bytes exceeds the limit of {limit} bytes")
    body = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for piece in request.stream():
                body += piece
                if len(body) > limit:
                    raise TooLargeError(f"request body exceeds the limit of {limit} bytes")
    except TimeoutError:
        raise RequestTimeoutError(f"the request body did not arrive within {timeout:g}s") from None
    except ClientDisconnect:
        raise ClientGoneError("the client closed the connection while sending the body") from None
    if not body:
        raise BadRequestError("empty body: send a JSON object with a 'messages' field")
    try:
        return json.loads(body)
    except RecursionError:
        raise BadRequestError("malformed JSON body: nests too deep") from None
    except ValueError as exc:
        raise BadRequestError(f"malformed JSON body: {exc}") from None


def build_http_app(service: ServiceCore) -> ASGIApp:
    """The ASGI app of the HTTP API, bound to a running `Service`."""
    settings = service.settings

    async def admit(request: Request) -> tuple[str, Agent, AgentCall]:
        """The agent and the validated call of a generate or stream request, with a run slot taken."""
        agent_id = request.path_params["agent_id"]
        agent = service.agent(agent_id)
        caller = caller_of(request)
        call = parse_body(
            await _read_json(request, settings.max_request_bytes, settings.body_timeout_seconds),
            caller=caller,
            trust=service.trust,
            limits=service.limits,
        ).traced(request.headers)
        control.admit(service, agent_id, call, caller)
        return agent_id, agent, call

    async def generate(request: Request) -> Response:
        agent_id, agent, call = await admit(request)
        release = _releaser(service)
        try:
            started = time.perf_counter()
            if _durable.is_durable(service, agent_id, call):
                durable, run_id = await _durable.begin(service, agent_id, call)
                done = await durable.result(run_id)
                if done is None:  # it stopped on this replica (drain, lost lease): observe it
                    await release()
                    log.info("generate agent=%s durable run=%s left this replica", agent_id, run_id)
                    return error_response(
                        503, "the durable run goes on elsewhere: observe it with its runId", runId=run_id
                    )
                body = result_json(done)
                log.info(
                    "generate agent=%s durable run=%s finish=%s %.3fs",
                    agent_id,
                    run_id,
                    body["finishReason"],
                    time.perf_counter() - started,
                )
                return _GatedResponse(body, release)
            try:
                body = result_json(await agent.generate(call.input, call.options))
            except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
                body = failed_json(exc)  # a failed run, not a failed request (a store error names the store)
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
        return _GatedResponse(body, release)

    async def stream(request: Request) -> Response:
        agent_id, agent, call = await admit(request)
        if _durable.is_durable(service, agent_id, call):
            try:
                durable, run_id = await _durable.begin(service, agent_id, call)
            except BaseException:
                service.gate.leave()
                raise
            # A client that leaves does not abort the run: it observes it again from its last id.
            events = _durable.sse(run_id, durable.attach(run_id, 0), "stream", settings.sse_heartbeat_seconds)
            return _EventStreamResponse(events, _releaser(service), {"X-Run-Id": run_id})
        return _stream_response(service, control.stream(service, agent_id, agent, call))

    async def decision_of(request: Request) -> tuple[str, Agent, ResumeRequest, Caller]:
        agent_id = request.path_params["agent_id"]
        agent = service.agent(agent_id)
        caller = caller_of(request)
        decision = parse_resume(
            await _read_json(request, settings.max_request_bytes, settings.body_timeout_seconds),
            caller=caller,
            trust=service.trust,
            limits=service.limits,
        )
        return agent_id, agent, decision, caller

    def resume_route(approved: bool) -> Callable[[Request], Awaitable[Response]]:
        async def resume(request: Request) -> Response:
            agent_id, agent, decision, caller = await decision_of(request)
            live = await control.resume(service, agent_id, agent, decision, approved=approved, caller=caller)
            return _stream_response(service, live)

        return resume

    def resume_generate_route(approved: bool) -> Callable[[Request], Awaitable[Response]]:
        async def resume(request: Request) -> Response:
            agent_id, agent, decision, caller = await decision_of(request)
            service.gate.enter()
            release = _releaser(service)
            try:
                try:
                    body = result_json(
                        await resume_generate(agent, decision, approved=approved, caller=caller)
                    )
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
            return _GatedResponse(body, release)

        return resume

    async def suspended_runs(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        agent = service.agent(agent_id)
        query = request.query_params
        caller = caller_of(request)
        resource = query.get("resourceId")
        if not caller.operator:
            if resource and resource != caller.resource:
                raise BadRequestError("resourceId: this API key is bound to another resource")
            resource = caller.resource or ""
        page = _query_int(query.get("page"), "page", 0, 0)
        per_page = _query_int(query.get("perPage"), "perPage", 20, 1)
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

    async def cancel_run(request: Request) -> Response:
        agent_id, run_id = request.path_params["agent_id"], request.path_params["run_id"]
        await control.cancel_run(service, agent_id, run_id, caller_of(request))
        return json_response({"cancelled": True})

    async def observe(request: Request) -> Response:
        agent_id = request.path_params["agent_id"]
        service.agent(agent_id)
        run_id, offset = _durable.parse_observe(
            await _read_json(request, settings.max_request_bytes, settings.body_timeout_seconds),
            request.headers.get("last-event-id"),
        )
        observed = await control.observe(service, run_id, offset, caller_of(request), agent_id=agent_id)
        return _EventStreamResponse(
            _durable.sse(run_id, observed.events, "observe", settings.sse_heartbeat_seconds),
            _no_release,
            {"X-Run-Id": run_id},
        )

    async def list_runs(request: Request) -> Response:
        query = request.query_params
        listing = _durable.run_query(
            resource_id=query.get("resourceId"),
            agent_id=query.get("agentId"),
            status=query.get("status"),
            page=_query_int(query.get("page"), "page", 0, 0),
            per_page=_query_int(query.get("perPage"), "perPage", _durable.DEFAULT_RUNS_PER_PAGE, 1),
            caller=caller_of(request),
        )
        runs, total = await _durable.list_runs(service, listing)
        return json_response({"runs": [_durable.run_json(r) for r in runs], "total": total})

    async def get_run(request: Request) -> Response:
        record = await _durable.visible_run(service, request.path_params["run_id"], caller_of(request))
        return json_response(_durable.run_json(record))

    async def cancel_durable_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        cancelled, after = await control.cancel_durable(service, run_id, caller_of(request))
        return json_response({"cancelled": cancelled, "run": _durable.run_json(after)})

    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(service.metrics.registry), headers={"Content-Type": content_type})

    async def healthz(request: Request) -> Response:
        return json_response({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if service.gate.draining:
            return json_response({"status": "draining", "configVersion": service.app.version}, 503)
        not_serving = service.health.not_serving
        # A fail-open sidecar that is down degrades runs, it does not fail them: the pod stays in
        # its Service, and the response names it.
        blocking = service.health.blocking
        down = service.health.dependencies
        if blocking or down:
            problems = []
            if blocking:
                problems.append(
                    "sidecars not serving: " + ", ".join(f"{n} is {s}" for n, s in sorted(blocking.items()))
                )
            if down:
                problems.append(
                    "durable runs: " + ", ".join(f"the {n} is {s}" for n, s in sorted(down.items()))
                )
            body_: dict[str, Any] = {
                "status": "not ready",
                "error": "; ".join(problems),
                "notServing": not_serving,
                "configVersion": service.app.version,
            }
            if down:
                body_["durable"] = down
            return json_response(body_, 503)
        body: dict[str, Any] = {
            "status": "ready",
            "sidecars": service.health.statuses,
            "configVersion": service.app.version,  # the config serving new runs (a reload changes it)
        }
        if not_serving:
            body["degraded"] = not_serving
        return json_response(body)

    async def on_service_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServiceError)
        return error_response(exc.http_status, str(exc))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(exc.status_code, exc.detail)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return error_response(500, "internal error")  # _Boundary logs it

    async def read_body(request: Request) -> Any:
        return await _read_json(request, settings.max_request_bytes, settings.body_timeout_seconds)

    app = Starlette(
        routes=[
            *catalog_routes(service, read_body),  # first: /api/agents/providers, agent details
            Route("/api/agents/{agent_id}/generate", generate, methods=["POST"]),
            Route("/api/agents/{agent_id}/stream", stream, methods=["POST"]),
            Route("/api/agents/{agent_id}/approve-tool-call", resume_route(True), methods=["POST"]),
            Route("/api/agents/{agent_id}/decline-tool-call", resume_route(False), methods=["POST"]),
            Route(
                "/api/agents/{agent_id}/approve-tool-call-generate",
                resume_generate_route(True),
                methods=["POST"],
            ),
            Route(
                "/api/agents/{agent_id}/decline-tool-call-generate",
                resume_generate_route(False),
                methods=["POST"],
            ),
            Route("/api/agents/{agent_id}/suspended-runs", suspended_runs, methods=["GET"]),
            Route("/api/agents/{agent_id}/runs/{run_id}/cancel", cancel_run, methods=["POST"]),
            Route("/api/agents/{agent_id}/observe", observe, methods=["POST"]),
            Route("/api/runs", list_runs, methods=["GET"]),
            Route("/api/runs/{run_id}", get_run, methods=["GET"]),
            Route("/api/runs/{run_id}/cancel", cancel_durable_run, methods=["POST"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            *memory_routes(service, read_body),
            *unsupported_routes(service),  # last: the 501s never shadow a route served above
        ],
        exception_handlers={
            ServiceError: on_service_error,
            HTTPException: on_http_error,
            Exception: on_unexpected,
        },
    )
    return _Boundary(app, service)


def _query_int(raw: str | None, name: str, default: int, low: int) -> int:
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or int(raw) < low or int(raw) > MAX_PAGE:
        raise BadRequestError(f"{name}: must be an integer from {low} to {MAX_PAGE}")
    return int(raw)


async def _no_release() -> None:
    """Observing holds no run slot: the run goes on whether or not anyone watches."""


def _stream_response(core: ServiceCore, live: LiveRun) -> Response:
    return _EventStreamResponse(_events(core, live), _stream_releaser(core, live))


def _stream_releaser(core: ServiceCore, live: LiveRun) -> Release:
    """Give a streamed run's slot back once it is sent or its client left: a run still going is
    aborted, or, with ``abort_on_disconnect`` off, finishes in the background first."""

    async def release() -> None:
        if core.settings.abort_on_disconnect:
            await live.close(abort=True)
        else:
            core.spawn(live.close(abort=False))

    return release


def _releaser(core: ServiceCore) -> Release:
    """Give a generate call's run slot back exactly once."""
    released = False

    async def release() -> None:
        nonlocal released
        if not released:
            released = True
            core.gate.leave()

    return release
