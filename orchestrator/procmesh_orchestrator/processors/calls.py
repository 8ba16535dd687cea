"""The run's `HookCaller` over gRPC: contexts, deadlines, the failure policy, shadow mode, metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import struct_pb2

from procmesh import convert, tracing
from procmesh.errors import ProcmeshError
from procmesh.hooks import BY_NAME
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError, ProcessorFailedError, TripwireAbort
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors import wire
from procmesh_orchestrator.processors.lanes import ParallelGroup, ProcessorHandle, RunLaneItem
from procmesh_orchestrator.processors.stream import OutputPipeline
from procmesh_orchestrator.run.hooks import Chunk, Effects, HookArgs, Processor, Reply, RunInfo, StreamItem

log = logging.getLogger(__name__)

R = TypeVar("R")


def _copy(request: Any) -> Any:
    """A request for one parallel branch (each fills its own context)."""
    clone = type(request)()
    clone.CopyFrom(request)
    return clone


def _outcome(response: Any, effects: Effects) -> str:
    """A hook call's outcome for its span: abort, retry (an abort that replays), rewrite, pass."""
    if effects.abort is not None:
        return "retry" if effects.abort.retry else "abort"
    changed = any(field.name != "effects" for field, _ in response.ListFields())
    return "rewrite" if changed else "pass"


def _as_lane_item(item: Processor) -> RunLaneItem:
    # The run hands back only what this side gave it (lane entries are ours): anything else is a bug.
    assert isinstance(item, ProcessorHandle | ParallelGroup), f"not a processor of this caller: {item!r}"
    return item


class GrpcHookCaller:
    """Calls one run's processors over gRPC and applies each one's failure policy.

    Built per run (`CallerFactory`): it fills every request's RunContext from the run's
    `RunInfo` and counts and times each call on the metrics object.
    """

    def __init__(self, info: RunInfo, metrics: OrchestratorMetrics) -> None:
        self.info = info
        self.metrics = metrics
        self.request_context = convert.to_struct(info.request_context)

    # -- context and deadlines ------------------------------------------------------------

    def fill_context(self, ctx: tpb.RunContext, handle: ProcessorHandle) -> None:
        """Fill a request's RunContext for `handle`."""
        info = self.info
        ctx.processor_id = "" if handle.tool_host else handle.hosted_id or handle.processor_id
        ctx.run_id = info.run_id
        ctx.agent_id = info.agent_id
        ctx.step_number = info.step_number
        ctx.retry_count = info.retry_count
        ctx.options.CopyFrom(handle.options)
        state = info.states.get(handle.processor_id)
        if isinstance(state, struct_pb2.Struct):
            ctx.state.CopyFrom(state)
        ctx.request_context.CopyFrom(self.request_context)
        ctx.thread_id = info.thread_id
        ctx.resource_id = info.resource_id

    def export_states(self) -> dict[str, Any]:
        """Every processor's state as JSON (a suspended run's snapshot keeps it)."""
        return {
            pid: convert.from_struct(state)
            for pid, state in self.info.states.items()
            if isinstance(state, struct_pb2.Struct)
        }

    def import_states(self, states: dict[str, Any]) -> None:
        """Put back states `export_states` gave (a resumed run)."""
        for pid, state in states.items():
            self.info.states[pid] = convert.to_struct(state)

    def timeout_for(self, handle: ProcessorHandle) -> float:
        """The call timeout: the processor's, capped by what is left of the run's deadline."""
        if self.info.deadline is None:
            return handle.timeout
        return max(0.001, min(handle.timeout, self.info.deadline - time.monotonic()))

    def stream_timeout(self) -> float | None:
        """A stream lives as long as the run may."""
        return None if self.info.deadline is None else max(0.001, self.info.deadline - time.monotonic())

    # -- the failure policy -----------------------------------------------------------------

    def policy(
        self, handle: ProcessorHandle, hook: str, cause: str, *, input_refused: bool = False
    ) -> ProcessorFailedError | None:
        """The failure policy's verdict: the error to raise (fail-closed), or None (logged, counted).

        A sidecar that refused the run's input (INVALID_ARGUMENT) fails the run under either
        policy: failing open there would hand the model exactly what the guard could not check.
        """
        if input_refused:
            self.metrics.processor_call(handle.processor_id, hook, "input_refused")
            return ProcessorFailedError(
                handle.processor_id, hook, f"the processor refused the input: {cause}"
            )
        if handle.on_failure == "fail-open":
            log.warning(
                "processor %s failed in %s, skipped (fail-open): %s", handle.processor_id, hook, cause
            )
            self.metrics.processor_call(handle.processor_id, hook, "failed_open")
            return None
        self.metrics.processor_call(handle.processor_id, hook, "failed")
        return ProcessorFailedError(handle.processor_id, hook, cause)

    def fail(self, item: Processor, hook: str, cause: str, *, input_refused: bool = False) -> None:
        """Apply the failure policy: raise (fail-closed) or log and count (fail-open)."""
        lane_item = _as_lane_item(item)
        # a parallel group's result is its picked branch's, so that branch answers for it
        handle = lane_item.branches[lane_item.pick] if isinstance(lane_item, ParallelGroup) else lane_item
        error = self.policy(handle, hook, cause, input_refused=input_refused)
        if error is not None:
            raise error

    def shadow_verdict(self, handle: ProcessorHandle, hook: str, abort: TripwireAbort | None) -> None:
        """Count and log what a shadow processor decided; nothing of it is applied."""
        verdict = "abort" if abort is not None else "allow"
        self.metrics.processor_call(handle.processor_id, hook, f"shadow_{verdict}")
        if abort is not None:
            # the reason may quote user content: it is logged at DEBUG only
            log.info("shadow processor %s would abort in %s (not enforced)", handle.processor_id, hook)
            log.debug("shadow processor %s abort reason: %s", handle.processor_id, abort.reason)

    # -- unary hooks ---------------------------------------------------------------------------

    async def call(self, item: Processor, args: HookArgs[R]) -> Reply[R]:
        """Call a unary hook with the run's arguments; an empty reply when failed open."""
        hook = args.hook
        answer = await self.invoke(_as_lane_item(item), hook, wire.build_request(args))
        response, effects = answer
        if response is None:
            return Reply(None, effects)
        result: R = wire.read_result(hook, response)
        return Reply(result, effects)

    async def invoke(self, item: RunLaneItem, hook: str, request: Any) -> tuple[Any, Effects]:
        """Call `hook` with a built request: (response, effects), response None when nothing applies."""
        if isinstance(item, ParallelGroup):
            return await self._invoke_parallel(item, hook, request)
        self.fill_context(request.context, item)
        attributes = {"procmesh.processor.id": item.processor_id, "procmesh.hook": hook}
        with tracing.span(
            f"procmesh.hook {hook} {item.processor_id}", kind="client", attributes=attributes
        ) as span:
            response, effects = await self._invoke_one(item, hook, request, span)
        return response, effects

    async def _invoke_one(
        self, item: ProcessorHandle, hook: str, request: Any, span: tracing.Span
    ) -> tuple[Any, Effects]:
        started = time.perf_counter()
        try:
            try:
                response = await item.client.call(
                    BY_NAME[hook].rpc, request, self.timeout_for(item), metadata=tracing.metadata()
                )
            finally:
                self.metrics.processor_call_duration.labels(item.processor_id, hook).observe(
                    time.perf_counter() - started
                )
            effects = wire.read_effects(item.processor_id, hook, response.effects, self.info.states)
        except ProcmeshError as exc:
            refused = exc.code == grpc.StatusCode.INVALID_ARGUMENT
            span.outcome("failure")
            self.fail(item, hook, f"{exc.code.name}: {exc}", input_refused=refused)
            return None, Effects()
        except MalformedResponseError as exc:
            span.outcome("failure")
            self.fail(item, hook, f"malformed response: {exc}")
            return None, Effects()
        span.outcome(_outcome(response, effects))
        if item.shadow:
            span.set("procmesh.shadow", True)
            self.shadow_verdict(item, hook, effects.abort)
            return None, Effects(violations=effects.violations)
        self.metrics.processor_call(item.processor_id, hook, "abort" if effects.abort else "ok")
        return response, effects

    async def _invoke_parallel(self, group: ParallelGroup, hook: str, request: Any) -> tuple[Any, Effects]:
        branches = [b for b in group.branches if b.has(hook)]
        answers = await asyncio.gather(*(self.invoke(b, hook, _copy(request)) for b in branches))
        merged = Effects()
        picked: Any = None
        for branch, (response, effects) in zip(branches, answers, strict=True):
            merged.violations += effects.violations
            if response is None:
                continue
            merged.signals += effects.signals
            merged.custom_chunks += effects.custom_chunks
            merged.abort = merged.abort or effects.abort
            if branch is group.branches[group.pick]:
                picked = response
        return (picked if picked is not None else wire.empty_response(hook), merged)

    # -- the output stream ---------------------------------------------------------------------

    def stream(
        self, lane: Sequence[Processor], source: AsyncIterator[Chunk], *, announce_signals: bool
    ) -> AsyncGenerator[StreamItem, None]:
        """Run `source` through the lane's process_output_stream processors (`OutputPipeline`)."""
        pipeline = OutputPipeline(self, [_as_lane_item(i) for i in lane], announce_signals=announce_signals)
        return pipeline.run(source)
