"""The run's `HookCaller` over gRPC: contexts, deadlines, the failure policy, monitor mode, metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

from google.protobuf import struct_pb2

from procmesh import convert, tracing
from procmesh.errors import ProcmeshError
from procmesh.hooks import BY_NAME
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError, ProcessorFailedError, TripwireAbort
from procmesh_orchestrator.metrics import OrchestratorMetrics, Series, series
from procmesh_orchestrator.processors import wire
from procmesh_orchestrator.processors.attempts import HookAttempt
from procmesh_orchestrator.processors.decisions import DecisionLog
from procmesh_orchestrator.processors.encodings import MessageEncodings
from procmesh_orchestrator.processors.lanes import (
    Gated,
    ParallelGroup,
    ProcessorHandle,
    RunLaneItem,
    TryCatch,
)
from procmesh_orchestrator.processors.stream import OutputPipeline
from procmesh_orchestrator.processors.stream_rehearsal import StreamRehearsal
from procmesh_orchestrator.run.hooks import (
    Attempt,
    Chunk,
    Effects,
    HookArgs,
    Processor,
    Reply,
    RunInfo,
    StreamItem,
)

log = logging.getLogger(__name__)

R = TypeVar("R")

_STREAM = "process_output_stream"
"""The hook `stream` and `rehearse` call (`on_call` is told it)."""


def _as_handle(item: Processor) -> ProcessorHandle:
    assert isinstance(item, ProcessorHandle), f"only a processor handle is sent on its own: {item!r}"
    return item


def _as_lane_item(item: Processor) -> RunLaneItem | TryCatch | Gated:
    # The run hands back only what this side gave it (lane entries are ours): anything else is a bug.
    assert isinstance(item, ProcessorHandle | ParallelGroup | TryCatch | Gated), (
        f"not a processor of this caller: {item!r}"
    )
    return item


def _mapped(group: ParallelGroup, hook: str, answered: list[tuple[ProcessorHandle, Any]]) -> Any:
    """A parallel group's result as its map says (the seeds' ``.map()``): the picked branch's, or
    with `merge` each field from the first (last) branch whose answer set it, i.e. left it other
    than an answer that changes nothing leaves it."""
    unchanged = wire.read_result(hook, wire.empty_response(hook))
    if not group.merge:
        picked = group.branches[group.pick]
        response = next((r for b, r in answered if b is picked), None)
        return unchanged if response is None else wire.read_result(hook, response)
    results = [wire.read_result(hook, r) for _, r in answered]
    if group.merge == "last":
        results.reverse()
    out = unchanged
    for f in dataclasses.fields(out):
        setting = (getattr(r, f.name) for r in results if getattr(r, f.name) != getattr(unchanged, f.name))
        setattr(out, f.name, next(setting, getattr(unchanged, f.name)))
    return out


@dataclasses.dataclass(slots=True)
class _Kept:
    """A processor's RunContext as encoded (`GrpcHookCaller.context_field`) and what it was made of."""

    handle: ProcessorHandle
    key: tuple[Any, ...]
    request_context: dict[str, Any]
    state: object
    sources: dict[str, str]
    field: bytes


class GrpcHookCaller:
    """Calls one run's processors over gRPC and applies each one's failure policy.

    Built per run (`CallerFactory`): it fills every request's RunContext from the run's
    `RunInfo` and counts and times each call on the metrics object. `on_call`, when given, is told
    each hook's name as the run calls it (`call`, `send`, `stream`, `rehearse`), before anything is
    sent: the App learns from it that a failed attempt's next one has begun (`app._attempts`).
    """

    def __init__(
        self, info: RunInfo, metrics: OrchestratorMetrics, on_call: Callable[[str], object] = lambda _: None
    ) -> None:
        self.info = info
        self.metrics = metrics
        self.on_call = on_call
        self._context_of: dict[str, Any] | None = None
        self._context = struct_pb2.Struct()
        self.decisions: DecisionLog | None = None
        """The run's decision record (also its `RunInfo.decisions`), when the config keeps one."""
        self.encodings = MessageEncodings()
        """The run's messages as encoded for its requests, reused while unchanged (bench P1)."""
        self._contexts: dict[int, _Kept] = {}
        """Each processor's RunContext as last sent (`context_field`), by its handle's id."""

    def request_context(self) -> struct_pb2.Struct:
        """The run's request context as sent: converted once per value of it (a hook that sets a
        value gives the run a new context, `run.context.set_values`)."""
        if self._context_of is not self.info.request_context:
            self._context = convert.to_struct(self.info.request_context)
            self._context_of = self.info.request_context
        return self._context

    def series(self, handle: ProcessorHandle) -> Series:
        """`handle`'s metric labels in this run: agent, sidecar, processor, entry."""
        return series(self.info.agent_id, handle.processor_id, handle.source)

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
        ctx.request_context.CopyFrom(self.request_context())
        ctx.thread_id = info.thread_id
        ctx.resource_id = info.resource_id
        ctx.on_failure = handle.on_failure
        if info.message_sources:  # a map's update() goes through Python's generic MutableMapping
            ctx.message_sources.update(info.message_sources)

    def context_field(self, handles: Sequence[ProcessorHandle]) -> bytes:
        """The RunContext of a request to `handles` (the first's, the others fused) as the request's
        encoded ``context`` field. A processor's is encoded once while what it carries is unchanged:
        every call of a step sends it the same (bench P1). The request context is replaced, never
        changed in place, so it is compared by identity (as `request_context` does); a state is
        compared as protobuf (each answer brings a new one, most often equal); the message
        sources are the run's live map, compared by value."""
        handle, info = handles[0], self.info
        if len(handles) > 1:  # a fused request's context names its further processors
            ctx = tpb.RunContext()
            self.fill_context(ctx, handle)
            self.fill_fused(ctx, handles[1:])
            return wire.context_field(ctx.SerializeToString())
        key = (
            info.step_number,
            info.retry_count,
            info.run_id,
            info.agent_id,
            info.thread_id,
            info.resource_id,
        )
        state = info.states.get(handle.processor_id)
        kept = self._contexts.get(id(handle))
        if (
            kept is not None
            and kept.handle is handle
            and kept.key == key
            and kept.request_context is info.request_context
            and (kept.state is state or kept.state == state)
            and kept.sources == info.message_sources
        ):
            return kept.field
        ctx = tpb.RunContext()
        self.fill_context(ctx, handle)
        field = wire.context_field(ctx.SerializeToString())
        sources = dict(info.message_sources)
        self._contexts[id(handle)] = _Kept(handle, key, info.request_context, state, sources, field)
        return field

    def fill_fused(self, ctx: tpb.RunContext, handles: Sequence[ProcessorHandle]) -> None:
        """Name the further processors of a fused request, each with its options and state."""
        for handle in handles:
            fused = ctx.fused.add(
                processor_id=handle.hosted_id or handle.processor_id, on_failure=handle.on_failure
            )
            fused.options.CopyFrom(handle.options)
            state = self.info.states.get(handle.processor_id)
            if isinstance(state, struct_pb2.Struct):
                fused.state.CopyFrom(state)

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

    def stream_timeout(self, bound: float) -> float:
        """A stream session's gRPC deadline: its `bound` (``streamTimeout``), capped by what is
        left of the run's deadline."""
        if self.info.deadline is None:
            return bound
        return max(0.001, min(bound, self.info.deadline - time.monotonic()))

    # -- the failure policy -----------------------------------------------------------------

    def policy(
        self,
        handle: ProcessorHandle,
        hook: str,
        cause: str,
        *,
        input_refused: bool = False,
        took: float = 0.0,
        seen: tuple[str, str | None] = ("", None),
    ) -> ProcessorFailedError | None:
        """The failure policy's verdict: the error to raise (fail-closed), or None (logged, counted,
        and on the run's decision record with the call's `took` and `seen` when known).

        A sidecar that refused the run's input (INVALID_ARGUMENT) fails the run under either
        policy: failing open there would hand the model exactly what the guard could not check.
        """
        if input_refused:
            outcome = "input_refused"
        else:
            outcome = "failed_open" if handle.on_failure == "fail-open" else "failed"
        self.metrics.processor_call(self.series(handle), hook, outcome)
        if self.decisions is not None:
            step = self.info.step_number
            self.decisions.add(self.series(handle), hook, step, outcome, took=took, seen=seen)
        if input_refused:
            return ProcessorFailedError(
                handle.processor_id, hook, f"the processor refused the input: {cause}"
            )
        if outcome == "failed_open":
            log.warning(
                "processor %s failed in %s, skipped (fail-open): %s", handle.processor_id, hook, cause
            )
            return None
        return ProcessorFailedError(handle.processor_id, hook, cause)

    def fail(
        self,
        item: Processor,
        hook: str,
        cause: str,
        *,
        input_refused: bool = False,
        took: float = 0.0,
        seen: tuple[str, str | None] = ("", None),
    ) -> None:
        """Apply the failure policy: raise (fail-closed) or log and count (fail-open)."""
        lane_item = _as_lane_item(item)
        # an error step's result is its attempt's, a parallel group's its picked branch's: they answer
        if isinstance(lane_item, Gated):
            lane_item = lane_item.item
        if isinstance(lane_item, TryCatch):
            lane_item = lane_item.attempt
        handle = lane_item.branches[lane_item.pick] if isinstance(lane_item, ParallelGroup) else lane_item
        error = self.policy(handle, hook, cause, input_refused=input_refused, took=took, seen=seen)
        if error is not None:
            raise error

    def monitor_decision(
        self, handle: ProcessorHandle, hook: str, would: str, abort: TripwireAbort | None = None
    ) -> None:
        """Record what a processor in mode monitor would have done (`MONITOR_DECISIONS`); nothing
        of it is applied. Counted (procmesh_monitor_decisions_total) and, unless it would pass,
        logged at INFO during the run (the line carries the run's ``run_id``); the call's span
        has it too (``procmesh.monitor.would``, set where the span is)."""
        labels = self.series(handle)
        self.metrics.monitor_decisions.labels(*labels, hook, would).inc()
        if would == "pass":
            return
        # the reason may quote user content: it is logged at DEBUG only
        log.info(
            "monitor: agent %s processor %s (sidecar %s, entry %s) would %s in %s (not enforced)",
            labels[0],
            labels[2],
            labels[1],
            labels[3],
            would,
            hook,
        )
        if abort is not None:
            log.debug("monitor: processor %s abort reason: %s", handle.processor_id, abort.reason)

    # -- unary hooks ---------------------------------------------------------------------------

    async def call(self, item: Processor, args: HookArgs[R]) -> Reply[R]:
        """Call a unary hook with the run's arguments; an empty reply when failed open."""
        self.on_call(args.hook)
        lane_item = _as_lane_item(item)
        if isinstance(lane_item, Gated):
            if not lane_item.runs(args, self.info):
                return Reply(None, Effects())
            lane_item = lane_item.item
        if isinstance(lane_item, TryCatch):
            return await self._try(lane_item, args)
        if isinstance(lane_item, ParallelGroup):
            answered, effects = await self._invoke_parallel(
                lane_item, args.hook, wire.encode_request(args, self.encodings)
            )
            # an empty result when no branch answered: the branches' effects still apply
            return Reply(_mapped(lane_item, args.hook, answered), effects)
        # awaited here, not through `send`'s task: a task costs a turn of the event loop (its
        # select call) and about a third of this call's own CPU (bench P1)
        request, timeout = self._prepared([lane_item], args)
        (attempt,) = await self._exchange([lane_item], args.hook, request, timeout, False)
        return attempt.commit()

    def send(
        self, group: Sequence[Processor], args: HookArgs[R], *, speculative: bool = False
    ) -> asyncio.Task[list[Attempt[R]]]:
        """Start a unary hook on `group`, one request, nothing applied until an attempt commits.

        Several processors go as one fused request (`RunContext.fused`); the answer has an
        attempt for each processor that ran, in order (the others did not run). The request's
        contexts are filled now, so the run's counters at this moment are the ones sent.
        """
        self.on_call(args.hook)
        handles = [_as_handle(item) for item in group]
        request, timeout = self._prepared(handles, args)
        return asyncio.create_task(self._attempts(handles, args.hook, request, timeout, speculative))

    def _prepared(self, handles: list[ProcessorHandle], args: HookArgs[Any]) -> tuple[bytes, float]:
        """The serialized request for `handles` (the first's context, the others fused) and its
        timeout."""
        request = wire.encode_request(args, self.encodings) + self.context_field(handles)
        if len(handles) > 1:
            return request, self.timeout_for(min(handles, key=lambda h: h.timeout))
        return request, self.timeout_for(handles[0])

    async def _attempts(
        self, handles: list[ProcessorHandle], hook: str, request: bytes, timeout: float, speculative: bool
    ) -> list[Attempt[R]]:
        return list(await self._exchange(handles, hook, request, timeout, speculative))

    async def _exchange(
        self, handles: list[ProcessorHandle], hook: str, request: bytes, timeout: float, speculative: bool
    ) -> list[HookAttempt[Any]]:
        first = handles[0]
        record = self.decisions
        seen = ("", None) if record is None else record.seen(BY_NAME[hook].request.FromString(request))
        if not tracing.enabled():  # the span's name, attributes and outcome are work only when recorded
            return await self._answers(handles, hook, request, timeout, speculative, seen, None)
        attributes: dict[str, Any] = {"procmesh.processor.id": first.processor_id, "procmesh.hook": hook}
        if len(handles) > 1:
            attributes["procmesh.fused"] = [h.processor_id for h in handles[1:]]
        name = f"procmesh.hook {hook} {first.processor_id}"
        with tracing.span(name, kind="client", attributes=attributes) as span:
            attempts = await self._answers(handles, hook, request, timeout, speculative, seen, span)
            span.outcome(attempts[0].span_outcome())
            if first.shadow and not attempts[0].failure:
                span.set("procmesh.monitor.would", attempts[0].would())
            return attempts

    async def _answers(
        self,
        handles: list[ProcessorHandle],
        hook: str,
        request: bytes,
        timeout: float,
        speculative: bool,
        seen: tuple[str, str | None],
        span: tracing.Span | None,
    ) -> list[HookAttempt[Any]]:
        """The call and an attempt for each processor that ran (the first's, then the fused)."""
        first = handles[0]
        metadata = () if span is None else tracing.metadata()
        started = time.perf_counter()
        try:
            response = await first.client.call(BY_NAME[hook].rpc, request, timeout, metadata)
        except ProcmeshError as exc:
            failure = wire.call_error(exc)
            failed: HookAttempt[Any] = HookAttempt(
                self, first, hook, speculative, time.perf_counter() - started
            )
            failed.seen = seen
            return [failed.failed(str(failure), refused=failure.input_refused)]
        took = time.perf_counter() - started
        attempt: HookAttempt[Any] = HookAttempt(self, first, hook, speculative, took)
        attempt.seen = seen
        if len(handles) == 1:
            try:
                attempt.answered(response, response.effects)
            except MalformedResponseError as exc:
                attempt.failed(f"malformed response: {exc}")
            return [attempt]
        outcomes = [(first, response.effects, "")]
        for handle, fused in zip(handles[1:], response.effects.fused, strict=False):
            outcomes.append((handle, fused.effects, fused.error))
        attempts: list[HookAttempt[Any]] = []
        last = len(outcomes) - 1
        for i, (handle, effects_pb, error) in enumerate(outcomes):
            if i:
                attempt = HookAttempt(self, handle, hook, speculative, took)
                attempt.seen = seen
            attempts.append(attempt)
            if error:
                attempt.failed(error)
                break
            # a fused request's result fields are the last processor's: the ones before it
            # returned their input unchanged
            answer = response if i == last else wire.empty_response(hook)
            try:
                attempt.answered(answer, effects_pb)
            except MalformedResponseError as exc:
                attempt.failed(f"malformed response: {exc}")
                break
        return attempts

    async def _try(self, step: TryCatch, args: HookArgs[R]) -> Reply[R]:
        """An error step: the attempt, or the fallback when the attempt's failure would fail the run
        (counted and logged as that failure already was)."""
        try:
            return await self.call(step.attempt, args)
        except ProcessorFailedError as exc:
            log.warning("workflow step %s failed in %s, its catch runs: %s", step.key, args.hook, exc)
            if not step.fallback.has(args.hook):
                return Reply(None, Effects())
            return await self.call(step.fallback, args)

    async def _invoke_parallel(
        self, group: ParallelGroup, hook: str, request: bytes
    ) -> tuple[list[tuple[ProcessorHandle, Any]], Effects]:
        """Every branch with `hook`, concurrently: the branches that answered (in listed order)
        with their responses, and all their effects."""
        branches = [b for b in group.branches if b.has(hook)]
        answers = await asyncio.gather(*(self._branch(b, hook, request) for b in branches))
        merged = Effects()
        answered: list[tuple[ProcessorHandle, Any]] = []
        for branch, (response, effects) in zip(branches, answers, strict=True):
            merged.violations += effects.violations
            if response is None:
                continue
            merged.signals += effects.signals
            merged.custom_chunks += effects.custom_chunks
            merged.abort = merged.abort or effects.abort
            answered.append((branch, response))
        return answered, merged

    async def _branch(self, handle: ProcessorHandle, hook: str, request: bytes) -> tuple[Any, Effects]:
        """One parallel branch's call (`request` without its context), applied at once (a group is
        never speculative)."""
        request += self.context_field([handle])
        (attempt,) = await self._exchange([handle], hook, request, self.timeout_for(handle), False)
        return attempt.settle()

    # -- the output stream ---------------------------------------------------------------------

    def stream(
        self, lane: Sequence[Processor], source: AsyncIterator[Chunk], *, announce_signals: bool
    ) -> AsyncGenerator[StreamItem, None]:
        """Run `source` through the lane's process_output_stream processors (`OutputPipeline`)."""
        # an error step streams as its attempt: a stream is not replayed through the catch midway
        # (a step that tests the last user message has no stream hook: binding refused that)
        self.on_call(_STREAM)
        items = [_as_lane_item(i) for i in lane]
        plain = [i.attempt if isinstance(i, TryCatch) else i for i in items if not isinstance(i, Gated)]
        pipeline = OutputPipeline(self, plain, announce_signals=announce_signals)
        return pipeline.run(source)

    def rehearse(
        self, lane: Sequence[Processor], source: AsyncIterator[Chunk], *, announce_signals: bool
    ) -> StreamRehearsal:
        """`stream`, started now on a guess of its source, everything it gives held (`StreamRehearsal`)."""
        self.on_call(_STREAM)
        return StreamRehearsal(self, lane, source, announce_signals=announce_signals)
