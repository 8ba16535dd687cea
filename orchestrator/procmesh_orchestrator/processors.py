"""Calling processors over gRPC: handles, unary hooks with failure policy, the output-stream pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import struct_pb2

from procmesh import ProcessorClient, convert, translate_rpc_error
from procmesh.errors import ProcmeshError
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import ProcessorFailedError, TripwireAbort

log = logging.getLogger(__name__)

RPC_METHODS = {
    "process_input": "ProcessInput",
    "process_input_step": "ProcessInputStep",
    "process_llm_request": "ProcessLLMRequest",
    "process_llm_response": "ProcessLLMResponse",
    "process_output_step": "ProcessOutputStep",
    "process_tool_result": "ProcessToolResult",
    "process_output_result": "ProcessOutputResult",
    "process_api_error": "ProcessAPIError",
    "execute_tool": "ExecuteTool",
}
HOOK_BY_ENUM = {
    ppb.HOOK_PROCESS_INPUT: "process_input",
    ppb.HOOK_PROCESS_INPUT_STEP: "process_input_step",
    ppb.HOOK_PROCESS_LLM_REQUEST: "process_llm_request",
    ppb.HOOK_PROCESS_LLM_RESPONSE: "process_llm_response",
    ppb.HOOK_PROCESS_OUTPUT_STREAM: "process_output_stream",
    ppb.HOOK_PROCESS_OUTPUT_STEP: "process_output_step",
    ppb.HOOK_PROCESS_TOOL_RESULT: "process_tool_result",
    ppb.HOOK_PROCESS_OUTPUT_RESULT: "process_output_result",
    ppb.HOOK_PROCESS_API_ERROR: "process_api_error",
    ppb.HOOK_EXECUTE_TOOL: "execute_tool",
}


@dataclass(frozen=True)
class ProcessorHandle:
    """One lane entry bound to its sidecar: what to call, with which options and policy."""

    key: str
    processor_id: str
    """The processor's identity in the run: state, tripwires, violations, metrics (its `name`, or its id)."""
    client: ProcessorClient
    options: struct_pb2.Struct
    hooks: frozenset[str]
    process_data_parts: bool
    timeout: float
    on_failure: str
    shadow: bool = False
    """Run and record the verdict, never enforce it (a shadow processor also always fails open)."""
    hosted_id: str = ""
    """The id the sidecar hosts it under, when the lane entry renamed it (several instances)."""

    def has(self, hook: str) -> bool:
        """Whether the processor implements `hook`."""
        return hook in self.hooks


@dataclass(frozen=True)
class ParallelGroup:
    """A workflow's parallel step: branches run concurrently on the same input.

    Every branch's signals, custom chunks and aborts apply (the first abort in
    branch order wins, with its own processor id); the `pick` branch's result
    (its messages, prompt, part) is what goes on, as ``.map()`` chooses in the seeds.
    """

    key: str
    processor_id: str
    branches: tuple[ProcessorHandle, ...]
    pick: int = 0

    def has(self, hook: str) -> bool:
        """Whether any branch implements `hook`."""
        return any(b.has(hook) for b in self.branches)


@dataclass(frozen=True)
class Conditional:
    """A workflow's conditional step: `then` when every `when` key equals the request context's value."""

    when: dict[str, Any]
    then: tuple[ProcessorHandle, ...]
    otherwise: tuple[ProcessorHandle, ...] = ()

    def choose(self, request_context: dict[str, Any]) -> tuple[ProcessorHandle, ...]:
        """The branch this run takes."""
        ok = all(request_context.get(k) == v for k, v in self.when.items())
        return self.then if ok else self.otherwise


LaneItem = ProcessorHandle | ParallelGroup | Conditional
"""A resolved lane entry; conditionals are decided once per run (`expand_lane`)."""
RunLaneItem = ProcessorHandle | ParallelGroup


def expand_lane(items: Iterable[LaneItem], request_context: dict[str, Any]) -> tuple[RunLaneItem, ...]:
    """The lane a run uses: each conditional replaced by the branch its request context selects."""
    out: list[RunLaneItem] = []
    for item in items:
        if isinstance(item, Conditional):
            out.extend(item.choose(request_context))
        else:
            out.append(item)
    return tuple(out)


_RESPONSES: dict[str, Callable[[], Any]] = {
    "process_input": ppb.ProcessInputResponse,
    "process_input_step": ppb.ProcessInputStepResponse,
    "process_llm_request": ppb.ProcessLLMRequestResponse,
    "process_llm_response": ppb.ProcessLLMResponseResponse,
    "process_output_step": ppb.ProcessOutputStepResponse,
    "process_tool_result": ppb.ProcessToolResultResponse,
    "process_output_result": ppb.ProcessOutputResultResponse,
    "process_api_error": ppb.ProcessAPIErrorResponse,
    "execute_tool": ppb.ExecuteToolResponse,
}


@dataclass
class Effects:
    """A hook's effects, converted: the agent applies them in this order, then the abort."""

    signals: list[dict[str, Any]] = field(default_factory=list)
    custom_chunks: list[dict[str, Any]] = field(default_factory=list)
    abort: TripwireAbort | None = None


ViolationSink = Callable[[str, str, Any], None]


class RunScope:
    """Per-run call context: ids, request context, per-processor state, step and retry counters."""

    def __init__(
        self,
        *,
        run_id: str,
        agent_id: str,
        request_context: dict[str, Any],
        on_violation: ViolationSink,
        deadline: float | None = None,
        thread_id: str = "",
        resource_id: str = "",
    ) -> None:
        self.run_id = run_id
        self.agent_id = agent_id
        self.request_context = convert.to_struct(request_context)
        self.states: dict[str, struct_pb2.Struct] = {}
        self.step_number = 0
        self.retry_count = 0
        self.on_violation = on_violation
        self.deadline = deadline
        self.thread_id = thread_id
        self.resource_id = resource_id

    def fill_context(
        self,
        ctx: tpb.RunContext,
        handle: ProcessorHandle,
        *,
        step_number: int | None = None,
        retry_count: int | None = None,
    ) -> None:
        """Fill a request's RunContext for `handle`."""
        ctx.processor_id = handle.hosted_id or handle.processor_id
        ctx.run_id = self.run_id
        ctx.agent_id = self.agent_id
        ctx.step_number = self.step_number if step_number is None else step_number
        ctx.retry_count = self.retry_count if retry_count is None else retry_count
        ctx.options.CopyFrom(handle.options)
        state = self.states.get(handle.processor_id)
        if state is not None:
            ctx.state.CopyFrom(state)
        ctx.request_context.CopyFrom(self.request_context)
        ctx.thread_id = self.thread_id
        ctx.resource_id = self.resource_id

    def timeout_for(self, handle: ProcessorHandle) -> float:
        """The call timeout: the processor's, capped by what is left of the run's deadline."""
        if self.deadline is None:
            return handle.timeout
        return max(0.001, min(handle.timeout, self.deadline - time.monotonic()))

    def stream_timeout(self) -> float | None:
        """A stream lives as long as the run may."""
        return None if self.deadline is None else max(0.001, self.deadline - time.monotonic())


class MalformedResponseError(Exception):
    """A sidecar's response breaks the contract."""


def read_effects(
    scope: RunScope, handle: ProcessorHandle, hook: str, effects: tpb.HookEffects, *, store_state: bool = True
) -> Effects:
    """Validate and convert a response's effects; record state and violations."""
    out = Effects()
    for chunk in effects.custom_chunks:
        if not chunk.type.startswith("data-"):
            raise MalformedResponseError(f"custom chunk type must start with 'data-', got {chunk.type!r}")
        out.custom_chunks.append(convert.chunk_from_proto(chunk))
    for signal in effects.signals:
        if not signal.contents and not signal.type:
            raise MalformedResponseError("signal without type or contents")
        out.signals.append(convert.signal_from_proto(signal))
    if store_state and effects.HasField("state"):
        scope.states[handle.processor_id] = effects.state
    for violation in effects.violations:
        detail = convert.from_value(violation.detail) if violation.HasField("detail") else None
        scope.on_violation(handle.processor_id, violation.message, detail)
    if effects.HasField("abort"):
        ab = effects.abort
        reason = ab.reason or f"Tripwire triggered by {handle.processor_id}"
        metadata = convert.from_value(ab.metadata) if ab.HasField("metadata") else None
        out.abort = TripwireAbort(handle.processor_id, reason, ab.retry, metadata, hook)
    return out


FailureCounter = Callable[[ProcessorHandle, str, str], None]
LatencySink = Callable[[ProcessorHandle, str, float], None]


def _copy(request: Any) -> Any:
    """A request for one parallel branch (each fills its own context)."""
    clone = type(request)()
    clone.CopyFrom(request)
    return clone


def _noop_failure(handle: ProcessorHandle, hook: str, outcome: str) -> None:
    return None


class HookCaller:
    """Calls unary hooks for one run and applies the failure policy."""

    def __init__(
        self,
        scope: RunScope,
        on_call: FailureCounter = _noop_failure,
        on_latency: LatencySink | None = None,
    ) -> None:
        self.scope = scope
        self._on_call = on_call
        self._on_latency = on_latency

    def fail(self, handle: ProcessorHandle, hook: str, cause: str) -> None:
        """Apply the failure policy: raise (fail-closed) or log and count (fail-open)."""
        if handle.on_failure == "fail-open":
            log.warning(
                "processor %s failed in %s, skipped (fail-open): %s", handle.processor_id, hook, cause
            )
            self._on_call(handle, hook, "failed_open")
            return
        self._on_call(handle, hook, "failed")
        raise ProcessorFailedError(handle.processor_id, hook, cause)

    async def call(self, handle: RunLaneItem, hook: str, request: Any) -> tuple[Any, Effects] | None:
        """Call `hook` on `handle`; None when the call failed and was let through (fail-open)."""
        if isinstance(handle, ParallelGroup):
            return await self._call_parallel(handle, hook, request)
        self.scope.fill_context(request.context, handle)
        started = time.perf_counter()
        try:
            try:
                response = await handle.client.call(
                    RPC_METHODS[hook], request, self.scope.timeout_for(handle)
                )
            finally:
                if self._on_latency is not None:
                    self._on_latency(handle, hook, time.perf_counter() - started)
            effects = read_effects(self.scope, handle, hook, response.effects)
        except ProcmeshError as exc:
            self.fail(handle, hook, f"{exc.code.name}: {exc}")
            return None
        except MalformedResponseError as exc:
            self.fail(handle, hook, f"malformed response: {exc}")
            return None
        if handle.shadow:
            self.shadow_verdict(handle, hook, effects.abort)
            return None
        self._on_call(handle, hook, "abort" if effects.abort else "ok")
        return response, effects

    async def _call_parallel(
        self, group: ParallelGroup, hook: str, request: Any
    ) -> tuple[Any, Effects] | None:
        branches = [b for b in group.branches if b.has(hook)]
        answers = await asyncio.gather(*(self.call(b, hook, _copy(request)) for b in branches))
        merged = Effects()
        picked: Any = None
        for branch, answer in zip(branches, answers, strict=True):
            if answer is None:
                continue
            response, effects = answer
            merged.signals += effects.signals
            merged.custom_chunks += effects.custom_chunks
            merged.abort = merged.abort or effects.abort
            if branch is group.branches[group.pick]:
                picked = response
        return (picked if picked is not None else _RESPONSES[hook](), merged)

    def shadow_verdict(self, handle: ProcessorHandle, hook: str, abort: TripwireAbort | None) -> None:
        """Count and log what a shadow processor decided; nothing of it is applied."""
        verdict = "abort" if abort is not None else "allow"
        self._on_call(handle, hook, f"shadow_{verdict}")
        if abort is not None:
            # the reason may quote user content: it is logged at DEBUG only
            log.info("shadow processor %s would abort in %s (not enforced)", handle.processor_id, hook)
            log.debug("shadow processor %s abort reason: %s", handle.processor_id, abort.reason)


# -- the output-stream pipeline ------------------------------------------------------

_END = "end"
_CHUNK = "chunk"
_ABORT = "abort"
_ERROR = "error"
_MAX_BATCH = 256
_WRITE_ERRORS = (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError)

Item = tuple[str, Any]
ChunkSink = Callable[[dict[str, Any]], Awaitable[None]]
SignalSink = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
"""Applies signals sent from process_output_stream; returns the chunks to emit for them."""


class _Stage:
    """One processor's ProcessOutputStream session: parts go out in batches, results come back in order.

    The feeder sends whatever is queued as one stream message; the reader
    applies each response's results in order and hands them on in bulk, so the
    next stage batches as well. Parts this processor must not see (data-*
    without process_data_parts, or everything once it failed open) pass
    through in their place.
    """

    def __init__(
        self,
        pipeline: OutputPipeline,
        handle: ProcessorHandle,
        inq: asyncio.Queue[Item],
        outq: asyncio.Queue[Item],
        *,
        side: bool = False,
    ) -> None:
        self.caller = pipeline.caller
        self.on_signals = pipeline.on_signals
        self.handle = handle
        self.side = side
        """A parallel branch whose output is not picked: its effects apply, the part goes on as it came."""
        self.inq = inq
        self.outq = outq
        # (kind, value, awaits_result) in arrival order; the head leaves first.
        self.pending: deque[tuple[str, Any, bool]] = deque()
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.failed_open = False
        self.broken: str | None = None
        """Why the stream failed, once it has (applied to the next part that needs an answer)."""
        self.stream_done = False
        self.end_queued = False
        self.stopped = False
        self.seq = 0
        self.sent: deque[tuple[int, float]] = deque()
        """(seq, when it was queued) of each part awaiting its result; timeouts count from then."""

    def _eligible(self, chunk: tpb.Chunk) -> bool:
        return not self.failed_open and (self.handle.process_data_parts or not chunk.type.startswith("data-"))

    def _flush_head(self) -> None:
        """Hand on every head item that needs no result (pass-throughs, end and error markers)."""
        pending = self.pending
        while pending and not self.stopped:
            kind, value, awaits = pending[0]
            if awaits:
                if not self.failed_open:
                    return
                pending.popleft()
                self.outq.put_nowait((_CHUNK, value))  # failed open: the part goes on unchanged
                continue
            if kind == _END and self.call is not None and not self.stream_done:
                return  # the state arrives with the stream's end
            pending.popleft()
            self.outq.put_nowait((kind, value))
            if kind != _CHUNK:
                self.stopped = True

    async def feed(self) -> None:
        while not self.stopped:
            batch: list[Item] = [await self.inq.get()]
            while len(batch) < _MAX_BATCH and not self.inq.empty():
                batch.append(self.inq.get_nowait())
            request: ppb.ProcessOutputStreamRequest | None = None
            finished = False
            for kind, value in batch:
                if kind != _CHUNK:  # end, upstream abort or error: nothing follows it
                    self.pending.append((kind, value, False))
                    self.end_queued = finished = True
                    break
                if self.broken is not None and self._eligible(value):
                    self._apply_failure()  # the stream died while idle: this part finds out
                    if self.stopped:
                        return
                if not self._eligible(value):
                    self.pending.append((_CHUNK, value, False))
                    continue
                if self.call is None:
                    request = self._open()
                elif request is None:
                    request = ppb.ProcessOutputStreamRequest()
                self.seq += 1
                part = request.parts.add()
                part.seq = self.seq
                part.part.CopyFrom(value)
                self.pending.append((_CHUNK, value, True))
                self.sent.append((self.seq, time.monotonic()))
            self._flush_head()
            if request is not None and not self.failed_open:
                # a failed write surfaces in the reader, which applies the failure policy
                with contextlib.suppress(*_WRITE_ERRORS):
                    await self.call.write(request)
            if finished:
                if self.call is not None and not self.failed_open:
                    with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
                        await self.call.done_writing()
                return

    def _open(self) -> ppb.ProcessOutputStreamRequest:
        scope = self.caller.scope
        self.call = self.handle.client.open_stream(scope.stream_timeout())
        self.reader = asyncio.create_task(self._read())
        first = ppb.ProcessOutputStreamRequest()
        scope.fill_context(first.context, self.handle)
        return first

    def _awaiting(self) -> bool:
        return any(awaits for _, _, awaits in self.pending)

    async def _read(self) -> None:
        scope, handle = self.caller.scope, self.handle
        # One read stays outstanding across timeouts: cancelling a read cancels the whole call.
        read: asyncio.Future[Any] | None = None
        try:
            while True:
                if read is None:
                    read = asyncio.ensure_future(self.call.read())
                if self.sent:  # the oldest unanswered part's time limit counts from when it was sent
                    limit = handle.timeout
                    sent_at = self.sent[0][1]
                    if scope.deadline is not None:
                        limit = min(limit, scope.deadline - sent_at)
                    wait = sent_at + limit - time.monotonic()
                    if wait <= 0:
                        raise MalformedResponseError(f"timed out after {limit:.3g}s")
                else:  # idle: wake up to start the clock of parts sent meanwhile
                    wait = scope.timeout_for(handle)
                done, _ = await asyncio.wait({read}, timeout=wait)
                if not done:
                    continue
                resp, read = read.result(), None
                if resp is grpc.aio.EOF:
                    if self._awaiting() or not self.end_queued:
                        raise MalformedResponseError("stream ended before every part was answered")
                    break
                for res in resp.results:
                    self._apply(res)
                    if self.stopped:
                        return
                if resp.HasField("end"):
                    scope.states[handle.processor_id] = resp.end.state
                self._flush_head()
        except grpc.aio.AioRpcError as exc:
            err = translate_rpc_error(exc)
            self._failed(f"{err.code.name}: {err}")
        except MalformedResponseError as exc:
            self._failed(str(exc))
        finally:
            if read is not None:
                read.cancel()
            self.stream_done = True
            self._flush_head()

    def _apply(self, res: ppb.StreamPartResult) -> None:
        """Apply one part's result; the parts before it that needed none go first."""
        while self.pending and not self.pending[0][2]:
            self._flush_one()
        if not self.pending:
            raise MalformedResponseError("more results than parts sent")
        _, original, _ = self.pending.popleft()
        seq, _ = self.sent.popleft()
        if res.seq != seq:
            raise MalformedResponseError(f"result for part {res.seq} where part {seq} was expected")
        if self.handle.shadow:  # record the verdict; the part goes on as it came
            abort = None
            if res.HasField("effects") and res.effects.HasField("abort"):
                abort = read_effects(
                    self.caller.scope, self.handle, "process_output_stream", res.effects, store_state=False
                ).abort
            self.caller.shadow_verdict(self.handle, "process_output_stream", abort)
            self.outq.put_nowait((_CHUNK, original))
            return
        if res.HasField("effects"):
            effects = read_effects(
                self.caller.scope, self.handle, "process_output_stream", res.effects, store_state=False
            )
            for chunk in self.on_signals(effects.signals) if effects.signals else ():
                self.outq.put_nowait((_CHUNK, convert.chunk_to_proto(chunk)))
            for custom in effects.custom_chunks:
                self.outq.put_nowait((_CHUNK, convert.chunk_to_proto(custom)))
            if effects.abort is not None:
                self.outq.put_nowait((_ABORT, effects.abort))
                self.stopped = True
                self.call.cancel()
                return
        if self.side:
            self.outq.put_nowait((_CHUNK, original))
        elif res.HasField("part"):
            self.outq.put_nowait((_CHUNK, res.part))
            for extra in res.extra_parts:
                self.outq.put_nowait((_CHUNK, extra))

    def _flush_one(self) -> None:
        kind, value, _ = self.pending.popleft()
        self.outq.put_nowait((kind, value))
        if kind != _CHUNK:
            self.stopped = True

    def _failed(self, cause: str) -> None:
        """The stream failed: apply the failure policy now if parts await answers, else at the next one."""
        self.broken = cause
        if self._awaiting():
            self._apply_failure()

    def _apply_failure(self) -> None:
        if self.stopped or self.failed_open:
            return
        self.call.cancel()
        try:
            self.caller.fail(self.handle, "process_output_stream", self.broken or "stream failed")
        except ProcessorFailedError as exc:
            self.outq.put_nowait((_ERROR, exc))
            self.stopped = True
            return
        self.failed_open = True
        self._flush_head()


class OutputPipeline:
    """Runs chunks through every output processor's process_output_stream, in lane order.

    Stages are pipelined (chunk n+1 can be at the first processor while chunk n
    is at the second) and each stage batches whatever is queued into one stream
    message; per-chunk semantics (emit, replace, drop, abort) stay exact.
    """

    def __init__(
        self, caller: HookCaller, handles: Iterable[RunLaneItem], on_signals: SignalSink | None = None
    ) -> None:
        self.caller = caller
        # A parallel group streams as its branches in a row: the others see each part as it came
        # (their verdicts and chunks apply, their output does not), then the picked branch.
        self.stages: list[tuple[ProcessorHandle, bool]] = []
        for item in handles:
            if isinstance(item, ParallelGroup):
                picked = item.branches[item.pick]
                self.stages += [(b, True) for b in item.branches if b is not picked]
                self.stages.append((picked, False))
            else:
                self.stages.append((item, False))
        self.stages = [(h, side) for h, side in self.stages if h.has("process_output_stream")]
        self.on_signals: SignalSink = on_signals or (lambda signals: [])

    async def run(self, source: AsyncIterator[dict[str, Any]], sink: ChunkSink) -> TripwireAbort | None:
        """Feed `source` through the stages into `sink`; return the abort that ended it, if any."""
        if not self.stages:
            async for chunk in source:
                await sink(chunk)
            return None
        queues: list[asyncio.Queue[Item]] = [asyncio.Queue() for _ in range(len(self.stages) + 1)]
        stages = [
            _Stage(self, h, queues[i], queues[i + 1], side=side) for i, (h, side) in enumerate(self.stages)
        ]

        async def produce() -> None:
            try:
                async for chunk in source:
                    await queues[0].put((_CHUNK, convert.chunk_to_proto(chunk)))
            except Exception as exc:  # the source's failure travels behind the chunks before it
                await queues[0].put((_ERROR, exc))
                return
            await queues[0].put((_END, None))

        async def guard(coro: Awaitable[None]) -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                await queues[-1].put((_ERROR, exc))

        tasks = [asyncio.create_task(guard(produce()))]
        tasks += [asyncio.create_task(guard(stage.feed())) for stage in stages]
        try:
            while True:
                kind, value = await queues[-1].get()
                if kind == _CHUNK:
                    await sink(convert.chunk_from_proto(value))
                elif kind == _END:
                    return None
                elif kind == _ABORT:
                    return value  # type: ignore[no-any-return]
                else:
                    raise value
        finally:
            tasks += [stage.reader for stage in stages if stage.reader is not None]
            for task in tasks:
                task.cancel()
            for stage in stages:
                if stage.call is not None and not stage.call.done():
                    stage.call.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
