"""The ProcessorService handlers, registered from the hook table (one generic handler per server).

Every unary hook has the same skeleton, so there is one: find the processor, build the
arguments (those every hook gets from the ``RunContext``, then the hook's own from its
decoder), call the hook on its processor's `HookLoop`, encode its return value (unless it
aborted) and its effects. Requests arrive as bytes and are decoded here (`_guard.decode`), so a
request that does not decode is INVALID_ARGUMENT, not grpc.aio's UNKNOWN. Errors are translated
here, once: a ``ProcmeshError`` aborts with its code, a malformed request with INVALID_ARGUMENT,
anything else a hook raised with INTERNAL; every status detail is clipped (`_guard.clip`).

``ExecuteTool`` is the exception to that last rule: a tool's exception is data, the tool's error
(``ExecuteToolResponse.error``), whether the tool is a processor's (``execute_tool``) or one the
sidecar hosts (a `Tool`, addressed by an empty ``processor_id``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from procmesh import convert, tracing
from procmesh._context import RequestContext
from procmesh._encode import fill_effects
from procmesh._fused import run_fused
from procmesh._guard import MALFORMED, RejectLog, clip, decode, short
from procmesh._hosted import Hosted, Tally
from procmesh._logging import RUN_ID
from procmesh._metrics import SidecarMetrics
from procmesh._model import Models, hook_deadline
from procmesh._model import hook_span as current_span
from procmesh._processor import HookEffects, TripWire, Writer
from procmesh._stream import output_stream_handler
from procmesh._tool import HostedTool, ToolContext, error_text, lifecycle
from procmesh._version import __version__
from procmesh.errors import (
    InternalError,
    InvalidInputError,
    NotFoundError,
    NotReadyError,
    ProcmeshError,
    UnimplementedError,
)
from procmesh.hooks import BASE_ARGUMENTS, BY_NAME, HOOKS, Hook
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

log = logging.getLogger(__name__)

SERVICE_NAME = "procmesh.v1.ProcessorService"
Context = grpc.aio.ServicerContext[Any, Any]
_EXECUTE_TOOL = BY_NAME["execute_tool"]


class _ToolRaised(Exception):
    """A tool raised an ordinary exception (its ``__cause__``): answered as the tool's error."""


class Servicer:
    """Serves the hosted processors' hooks; `handler()` is what the gRPC server registers."""

    def __init__(
        self, hosted: dict[str, Hosted], metrics: SidecarMetrics, tools: dict[str, HostedTool] | None = None
    ) -> None:
        self._hosted = hosted
        self._tools = tools or {}
        self._metrics = metrics
        for each in hosted.values():
            each.track(metrics)
        self.metrics = metrics
        """The SDK's series (the stream handler counts sessions on it)."""
        self.rejects = RejectLog()
        """Refused requests: counted, and logged as one rate-limited WARNING."""
        self.ready = False
        """Hooks are served only once every processor's setup() returned."""

    def handler(self) -> grpc.GenericRpcHandler:
        """Describe plus one handler per entry of the hook table (requests arrive undecoded)."""
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "Describe": grpc.unary_unary_rpc_method_handler(
                self.describe, response_serializer=ppb.DescribeResponse.SerializeToString
            )
        }
        for hook in HOOKS:
            if hook.streaming:
                handlers[hook.rpc] = grpc.stream_stream_rpc_method_handler(
                    output_stream_handler(self, hook), response_serializer=hook.response.SerializeToString
                )
            elif hook is _EXECUTE_TOOL:
                handlers[hook.rpc] = grpc.unary_unary_rpc_method_handler(
                    self._execute_tool(), response_serializer=hook.response.SerializeToString
                )
            else:
                handlers[hook.rpc] = grpc.unary_unary_rpc_method_handler(
                    self._unary(hook), response_serializer=hook.response.SerializeToString
                )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    async def describe(self, raw: bytes, context: Context) -> ppb.DescribeResponse:
        """Every hosted processor and the hooks it implements, and every hosted tool."""
        try:
            decode(ppb.DescribeRequest, raw, "Describe", self.rejects)
        except ProcmeshError as exc:
            await context.abort(exc.code, str(exc))
        return ppb.DescribeResponse(
            processors=[h.info() for h in self._hosted.values()],
            sdk=f"procmesh-python/{__version__}",
            tools=[t.info() for t in self._tools.values()],
            fuses=True,
        )

    def lookup(self, ctx: tpb.RunContext | tpb.FusedProcessor, hook: str) -> Hosted:
        """The processor a request names, once the server is ready and if it implements `hook`."""
        if not self.ready:
            raise NotReadyError("the sidecar is starting or draining; retry when health reports SERVING")
        if not ctx.processor_id:
            raise InvalidInputError("request.context.processor_id is required")
        hosted = self._hosted.get(ctx.processor_id)
        if hosted is None:
            raise NotFoundError(
                f"processor {short(ctx.processor_id)} is not hosted here (hosted: {sorted(self._hosted)})"
            )
        if hook not in hosted.hooks:
            raise UnimplementedError(f"processor {hosted.id!r} does not implement {hook}")
        return hosted

    def lookup_fused(self, ctx: tpb.RunContext, hook: str) -> list[Hosted]:
        """The further processors a fused request names (``context.fused``), each as `lookup` finds it."""
        return [self.lookup(member, hook) for member in ctx.fused]

    @staticmethod
    def base_kwargs(
        hosted: Hosted,
        ctx: tpb.RunContext,
        effects: HookEffects,
        member: tpb.FusedProcessor | None = None,
        wanted: frozenset[str] | None = None,
    ) -> dict[str, Any]:
        """The arguments every hook may declare, from the request's RunContext.

        For a further processor of a fused request, `member` (its ``context.fused`` entry) gives
        its own options and state; the rest of the context is the request's. With `wanted` (the
        arguments the hook declares) the ones that cost a conversion are made only if declared;
        options with an ``Options`` model are validated either way.
        """
        own = ctx if member is None else member
        if wanted is not None and wanted.isdisjoint(BASE_ARGUMENTS) and hosted.processor.Options is None:
            return {}  # a hook that declares none of them (its own request's fields at most)
        kwargs: dict[str, Any] = {
            "abort": effects.abort_hook,
            "retry_count": ctx.retry_count,
            "step_number": ctx.step_number,
            "run_id": ctx.run_id,
            "agent_id": ctx.agent_id,
            "thread_id": ctx.thread_id or None,
            "resource_id": ctx.resource_id or None,
            "on_failure": own.on_failure or None,
            "send_signal": effects.send_signal,
            "report_violation": effects.report_violation,
        }
        if wanted is None or "state" in wanted:
            kwargs["state"] = convert.from_struct(own.state)
        if wanted is None or "options" in wanted or hosted.processor.Options is not None:
            kwargs["options"] = hosted.options(own.options)
        if wanted is None or "request_context" in wanted:
            kwargs["request_context"] = RequestContext(
                convert.from_struct(ctx.request_context), effects.context_updates
            )
        if wanted is None or "writer" in wanted:
            kwargs["writer"] = Writer(effects)
        if wanted is None or "model" in wanted:
            kwargs["model"] = Models(hosted.id, ctx.run_id)
        return kwargs

    def invoke(
        self,
        hosted: Hosted,
        hook: str,
        kwargs: dict[str, Any],
        effects: HookEffects,
        *,
        quiet: bool = False,
        tally: Tally | None = None,
    ) -> Awaitable[Any]:
        """Run one hook with the arguments it declares (on the hook loop), to be awaited at once; a
        TripWire becomes the abort.

        `quiet`: a replay that rebuilds state after a rewind (`_rewind`), neither timed nor counted:
        the call it repeats already was. `tally`: a stream part, counted into its batch's tally
        (its latency observed once per batch) rather than as a call. Runs on the hook loop, the
        only writer of the processor's `Series`. Not a coroutine itself: the caller awaits the
        hook's (`timed`) without another frame.
        """
        params = hosted.params[hook]
        args = kwargs if params is None else {k: kwargs[k] for k in params}
        if quiet:
            return _untimed(hosted.hooks[hook], args, effects)
        record = (hosted.series[hook] if tally is None else tally).add
        return self.timed(hosted, hook, hosted.hooks[hook], args, effects, record)

    @staticmethod
    async def timed(
        hosted: Hosted,
        hook: str,
        fn: Callable[..., Awaitable[Any]],
        args: dict[str, Any],
        effects: HookEffects,
        record: Callable[[str, float], None],
    ) -> Any:
        """Await `fn` (processor `hosted`'s `hook`) with `args`, the arguments it declares; its
        outcome and time go to `record` (a `Series`, or a stream batch's `Tally`), a TripWire
        becomes the abort (`settle`)."""
        started = time.perf_counter()
        try:
            out = await fn(**args)
        except BaseException as exc:
            return Servicer.settle(hosted, hook, exc, effects, record, time.perf_counter() - started)
        record("ok", time.perf_counter() - started)
        return out

    @staticmethod
    def settle(
        hosted: Hosted,
        hook: str,
        exc: BaseException,
        effects: HookEffects,
        record: Callable[[str, float], None],
        seconds: float,
    ) -> None:
        """What a hook's exception makes of its call, recorded with its time: a TripWire is the
        hook's abort (set on `effects`; the call returns None); anything else is raised as the
        caller gets it (`_failure`). Called in the `except` of the hook's await."""
        if isinstance(exc, TripWire):
            effects.abort = exc
            record("abort", seconds)
            return None
        outcome, raised = _failure(hosted, hook, exc)
        record(outcome, seconds)
        if raised is exc:
            raise exc
        raise raised from exc

    def malformed(self, rpc: str, exc: BaseException) -> str:
        """Record a request its hook's decoder refused; the status detail to answer with."""
        self.rejects.note(rpc, type(exc).__name__, exc)
        if isinstance(exc, RecursionError):
            return f"malformed {rpc} request: nested too deeply"
        return f"malformed {rpc} request: {exc}"

    async def serve_call(
        self, hosted: Hosted, hook: Hook, request: Any, member: tpb.FusedProcessor | None = None
    ) -> Any:
        """One unary call's work, on the processor's hook loop: arguments, the hook, the response.

        Converting a large request to dicts and its answer back (a 1 MB message with 90,000
        redactions) costs as much CPU as the hook itself: done on the server loop, it kept health
        checks waiting for seconds, so all of it runs where the hook runs.
        """
        effects = HookEffects(hosted.id)
        kwargs = self.base_kwargs(hosted, request.context, effects, member, hosted.params[hook.name])
        if hosted.decodes[hook.name]:  # a hook that reads none of its request's fields skips decoding them
            kwargs.update(hook.decode(request))
        try:
            result = await self.invoke(hosted, hook.name, kwargs, effects)
        except _ToolRaised as raised:  # only execute_tool; its effects and state are dropped
            return ppb.ExecuteToolResponse(error=error_text(raised.__cause__ or raised))
        resp = hook.response() if effects.abort is not None else hook.encode(result, kwargs)
        state = kwargs.get("state")
        if state is not None or not effects.quiet():
            fill_effects(resp.effects, effects, state)
        if state is None:  # the hook did not take its state: it goes back as it came
            resp.effects.state.CopyFrom((request.context if member is None else member).state)
        return resp

    def lookup_tool(self, name: str) -> HostedTool:
        """The hosted tool an ExecuteTool request with an empty processor_id names."""
        if not self.ready:
            raise NotReadyError("the sidecar is starting or draining; retry when health reports SERVING")
        tool = self._tools.get(name)
        if tool is None:
            hosted = sorted(self._tools)
            raise NotFoundError(f"tool {short(name)} is not hosted here (hosted tools: {hosted})")
        return tool

    async def call_tool(self, tool: HostedTool, request: ppb.ExecuteToolRequest) -> ppb.ExecuteToolResponse:
        """One hosted tool call, on the tool's loop: its context, `execute`, the result or its error."""
        ctx = request.context
        context = ToolContext(
            run_id=ctx.run_id,
            agent_id=ctx.agent_id,
            tool_call_id=request.tool_call_id,
            thread_id=ctx.thread_id or None,
            resource_id=ctx.resource_id or None,
            request_context=convert.from_struct(ctx.request_context),
            messages=[convert.message_from_proto(m, keep_unknown=True) for m in request.messages],
            resumed=request.HasField("resume_data"),
            resume_data=convert.from_value(request.resume_data) if request.HasField("resume_data") else None,
            suspend_payload=convert.from_value(request.suspend_payload)
            if request.HasField("suspend_payload")
            else None,
        )
        args = convert.from_value(request.args) if request.HasField("args") else {}
        started = time.perf_counter()
        outcome = "ok"
        try:
            await lifecycle(tool.tool, "on_input_start", context)
            await lifecycle(tool.tool, "on_input_available", args, context)
            result = await tool.tool.execute(args, context)
            if context.suspension is not None:
                outcome = "suspended"
                resp = _suspended(tool.name, *context.suspension)
                for chunk in context.writer.chunks:
                    convert.chunk_to_proto(chunk, resp.effects.custom_chunks.add())
                return resp
            await lifecycle(tool.tool, "on_output", result, context)
            shown = tool.tool.to_model_output(result) if tool.maps_output else None
            resp = ppb.ExecuteToolResponse()
            for chunk in context.writer.chunks:
                convert.chunk_to_proto(chunk, resp.effects.custom_chunks.add())
            try:
                resp.result.CopyFrom(convert.to_value(result))
                if tool.maps_output:
                    resp.model_output.CopyFrom(convert.to_value(shown))
            except TypeError as exc:
                raise InternalError(f"tool {tool.name!r} returned a non-JSON result: {exc}") from exc
            return resp
        except ProcmeshError as exc:
            outcome = exc.code.name.lower()
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as exc:
            outcome = "tool_error"
            log.warning("tool %s raised %s", tool.name, type(exc).__name__, exc_info=True)
            return ppb.ExecuteToolResponse(error=error_text(exc))
        finally:
            self._metrics.tool_calls.labels(tool.name, outcome).inc()
            self._metrics.tool_latency.labels(tool.name).observe(time.perf_counter() - started)

    def run_hook(
        self,
        hosted: Hosted,
        hook: Hook,
        request: Any,
        context: Context,
        member: tpb.FusedProcessor | None = None,
    ) -> Awaitable[Any]:
        """A unary hook call on the processor's hook loop, inside the sidecar's span of it (to be
        awaited at once: the deadline is set in the caller's context, which the hook's task copies)."""
        left = context.time_remaining()
        hook_deadline.set(None if left is None else time.monotonic() + left)  # for `model` calls
        RUN_ID.set(request.context.run_id)  # the hook's log lines name its run (--log-format json)
        if not tracing.enabled():  # no span to make, name or count on (`current_span` stays None)
            return hosted.loop.run(lambda: self.serve_call(hosted, hook, request, member))
        return self._traced(hosted, hook, request, context, member)

    async def _traced(
        self, hosted: Hosted, hook: Hook, request: Any, context: Context, member: tpb.FusedProcessor | None
    ) -> Any:
        with hook_span(hook.name, hosted.id, context) as span:
            current_span.set(span)  # a pre-check's saved judge calls are counted on it
            resp = await hosted.loop.run(lambda: self.serve_call(hosted, hook, request, member))
            span.outcome(outcome_of(resp))
            return resp

    def _execute_tool(self) -> Callable[[bytes, Context], Awaitable[Any]]:
        hook = _EXECUTE_TOOL

        async def handle(raw: bytes, context: Context) -> Any:
            try:
                request = decode(hook.request, raw, hook.name, self.rejects)
                if request.context.fused:
                    raise InvalidInputError("ExecuteTool runs one tool: context.fused must be empty")
                if request.context.processor_id:  # a tool the processor added: as every hook
                    hosted = self.lookup(request.context, hook.name)
                    return await self.run_hook(hosted, hook, request, context)
                tool = self.lookup_tool(request.tool_name)
                RUN_ID.set(request.context.run_id)  # the tool's log lines name its run
                with hook_span(hook.name, "", context, tool=tool.name) as span:
                    resp = await tool.loop.run(lambda: self.call_tool(tool, request))
                    span.outcome("error" if resp.error else "ok")
                    return resp
            except ProcmeshError as exc:
                await context.abort(exc.code, clip(str(exc)))
            except MALFORMED as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, clip(self.malformed(hook.name, exc)))
            raise AssertionError("context.abort() returns only by raising")  # pragma: no cover

        return handle

    def _unary(self, hook: Hook) -> Callable[[bytes, Context], Awaitable[Any]]:
        async def handle(raw: bytes, context: Context) -> Any:
            try:
                request = decode(hook.request, raw, hook.name, self.rejects)
                hosted = self.lookup(request.context, hook.name)
                if request.context.fused:
                    return await run_fused(self, hosted, hook, request, context)
                return await self.run_hook(hosted, hook, request, context)
            except ProcmeshError as exc:
                await context.abort(exc.code, clip(str(exc)))
            except MALFORMED as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, clip(self.malformed(hook.name, exc)))
            raise AssertionError("context.abort() returns only by raising")  # pragma: no cover

        return handle


async def _untimed(fn: Callable[..., Awaitable[Any]], args: dict[str, Any], effects: HookEffects) -> Any:
    """A quiet replay's hook call (`Servicer.invoke`): a TripWire becomes the abort."""
    try:
        return await fn(**args)
    except TripWire as trip:
        effects.abort = trip
        return None


def _failure(hosted: Hosted, hook: str, exc: BaseException) -> tuple[str, BaseException]:
    """A hook that raised: its call's outcome, and what to raise for it (`exc` itself, or the
    error the caller gets in its place)."""
    if isinstance(exc, ProcmeshError):
        return exc.code.name.lower(), exc
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled", exc  # the call was cancelled or its deadline passed
    if not isinstance(exc, Exception):
        return "internal", exc  # SystemExit, KeyboardInterrupt: not the hook's to turn into a status
    if hook == "execute_tool":  # a tool's exception is the tool's error, not a failed call
        log.warning("processor %s tool raised %s", hosted.id, type(exc).__name__, exc_info=exc)
        return "tool_error", _ToolRaised()
    log.error("processor %s hook %s raised", hosted.id, hook, exc_info=exc)
    detail = f"processor {hosted.id!r} hook {hook} raised {type(exc).__name__}: {exc}"
    return "internal", InternalError(detail)


def hook_span(hook: str, processor_id: str, context: Context, *, tool: str = "") -> Any:
    """The sidecar's span of one call, child of the caller's (the trace context in its metadata)."""
    if not tracing.enabled():
        return tracing.span("")  # the shared no-op: no attributes, name or metadata to make
    parent = context.invocation_metadata()
    attributes = {"procmesh.hook": hook, "procmesh.processor.id": processor_id or None}
    if tool:
        attributes["gen_ai.tool.name"] = tool
    name = f"procmesh.hook {hook} {processor_id or tool}"
    return tracing.span(name, kind="server", attributes=attributes, parent=parent)


def outcome_of(response: Any) -> str:
    """What a hook's answer did: abort, retry (an abort that replays), rewrite, or pass."""
    effects = response.effects
    if effects.HasField("abort"):
        return "retry" if effects.abort.retry else "abort"
    return "rewrite" if any(f.name != "effects" for f, _ in response.ListFields()) else "pass"


def _suspended(tool: str, payload: Any, resume_schema: str) -> ppb.ExecuteToolResponse:
    """A hosted tool's answer when it called `ToolContext.suspend`."""
    resp = ppb.ExecuteToolResponse(resume_schema=resume_schema)
    try:
        resp.suspend_payload.CopyFrom(convert.to_value(payload))
    except TypeError as exc:
        raise InternalError(f"tool {tool!r} suspended with a non-JSON payload: {exc}") from exc
    return resp
