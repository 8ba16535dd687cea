"""Calling processors over gRPC: handles, unary hooks with failure policy, the output-stream pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import struct_pb2

from orchestrator.errors import ProcessorFailedError, TripwireAbort
from procmesh import ProcessorClient, convert, translate_rpc_error
from procmesh.errors import ProcmeshError
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

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
}


@dataclass(frozen=True)
class ProcessorHandle:
    """One lane entry bound to its sidecar: what to call, with which options and policy."""

    key: str
    processor_id: str
    client: ProcessorClient
    options: struct_pb2.Struct
    hooks: frozenset[str]
    process_data_parts: bool
    timeout: float
    on_failure: str

    def has(self, hook: str) -> bool:
        """Whether the processor implements `hook`."""
        return hook in self.hooks


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
        ctx.processor_id = handle.processor_id
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


def _noop_failure(handle: ProcessorHandle, hook: str, outcome: str) -> None:
    return None


class HookCaller:
    """Calls unary hooks for one run and applies the failure policy."""

    def __init__(self, scope: RunScope, on_call: FailureCounter = _noop_failure) -> None:
        self.scope = scope
        self._on_call = on_call

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

    async def call(self, handle: ProcessorHandle, hook: str, request: Any) -> tuple[Any, Effects] | None:
        """Call `hook` on `handle`; None when the call failed and was let through (fail-open)."""
        self.scope.fill_context(request.context, handle)
        try:
            response = await handle.client.call(RPC_METHODS[hook], request, self.scope.timeout_for(handle))
            effects = read_effects(self.scope, handle, hook, response.effects)
        except ProcmeshError as exc:
            self.fail(handle, hook, f"{exc.code.name}: {exc}")
            return None
        except MalformedResponseError as exc:
            self.fail(handle, hook, f"malformed response: {exc}")
            return None
        self._on_call(handle, hook, "abort" if effects.abort else "ok")
        return response, effects


# -- the output-stream pipeline ------------------------------------------------------

_END = "end"
_CHUNK = "chunk"
_ABORT = "abort"
_ERROR = "error"
_MAX_BATCH = 256

Item = tuple[str, Any]
ChunkSink = Callable[[dict[str, Any]], Awaitable[None]]


class _Stage:
    """One processor's ProcessOutputStream session: batches parts out, answers in order.

    Three coroutines: the feeder batches queued parts into stream messages, the
    reader matches results to parts by seq, the forwarder emits in order. Parts
    this processor must not see (data-* without process_data_parts) pass
    through in their place.
    """

    def __init__(
        self, caller: HookCaller, handle: ProcessorHandle, inq: asyncio.Queue[Item], outq: asyncio.Queue[Item]
    ) -> None:
        self.caller = caller
        self.handle = handle
        self.inq = inq
        self.outq = outq
        self.ordered: asyncio.Queue[tuple[str, Any, asyncio.Future[Any] | None]] = asyncio.Queue()
        self.futures: dict[int, asyncio.Future[Any]] = {}
        self.call: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.failure: str | None = None
        self.seq = 0

    def _eligible(self, chunk: tpb.Chunk) -> bool:
        return self.failure is None and (self.handle.process_data_parts or not chunk.type.startswith("data-"))

    async def _open(self) -> ppb.ProcessOutputStreamRequest:
        scope = self.caller.scope
        self.call = self.handle.client.open_stream(scope.stream_timeout())
        self.reader = asyncio.create_task(self._read())
        first = ppb.ProcessOutputStreamRequest()
        scope.fill_context(first.context, self.handle)
        return first

    async def _read(self) -> None:
        cause = "stream ended before every part was answered"
        try:
            async for resp in self.call:
                for res in resp.results:
                    fut = self.futures.pop(res.seq, None)
                    if fut is not None and not fut.done():
                        fut.set_result(res)
                if resp.HasField("end"):
                    self.caller.scope.states[self.handle.processor_id] = resp.end.state
        except grpc.aio.AioRpcError as exc:
            err = translate_rpc_error(exc)
            cause = f"{err.code.name}: {err}"
        finally:
            for fut in self.futures.values():
                if not fut.done():
                    fut.set_exception(MalformedResponseError(cause))
            self.futures.clear()

    async def feed(self) -> None:
        while True:
            batch: list[Item] = [await self.inq.get()]
            while len(batch) < _MAX_BATCH and not self.inq.empty():
                batch.append(self.inq.get_nowait())
            request: ppb.ProcessOutputStreamRequest | None = None
            finished = False
            for kind, value in batch:
                if kind != _CHUNK:  # end, upstream abort or error: nothing follows it
                    await self.ordered.put((kind, value, None))
                    finished = True
                    break
                if not self._eligible(value):
                    await self.ordered.put((_CHUNK, value, None))
                    continue
                if self.call is None:
                    request = await self._open()
                elif request is None:
                    request = ppb.ProcessOutputStreamRequest()
                self.seq += 1
                part = request.parts.add()
                part.seq = self.seq
                part.part.CopyFrom(value)
                fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                self.futures[self.seq] = fut
                await self.ordered.put((_CHUNK, value, fut))
            if request is not None:
                try:
                    await self.call.write(request)
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as exc:
                    self._fail_pending(f"write failed: {exc}")
            if finished:
                if self.call is not None:
                    with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError):
                        await self.call.done_writing()
                return

    def _fail_pending(self, cause: str) -> None:
        for fut in self.futures.values():
            if not fut.done():
                fut.set_exception(MalformedResponseError(cause))
        self.futures.clear()

    async def forward(self) -> None:
        handle = self.handle
        while True:
            kind, chunk, fut = await self.ordered.get()
            if kind == _END:
                if self.reader is not None:
                    await self.reader
                await self.outq.put((_END, None))
                return
            if kind != _CHUNK:
                await self.outq.put((kind, chunk))
                return
            if fut is None:
                await self.outq.put((_CHUNK, chunk))
                continue
            try:
                res = await asyncio.wait_for(fut, self.caller.scope.timeout_for(handle))
                effects = read_effects(
                    self.caller.scope, handle, "process_output_stream", res.effects, store_state=False
                )
            except (MalformedResponseError, TimeoutError) as exc:
                if self.failure is not None:  # already failed open: the rest passes through
                    await self.outq.put((_CHUNK, chunk))
                    continue
                cause = f"timed out after {handle.timeout}s" if isinstance(exc, TimeoutError) else str(exc)
                self.failure = cause
                if self.call is not None:
                    self.call.cancel()
                self._fail_pending(cause)
                self.caller.fail(handle, "process_output_stream", cause)  # raises when fail-closed
                await self.outq.put((_CHUNK, chunk))
                continue
            for custom in effects.custom_chunks:
                await self.outq.put((_CHUNK, convert.chunk_to_proto(custom)))
            if effects.abort is not None:
                await self.outq.put((_ABORT, effects.abort))
                return
            if res.HasField("part"):
                await self.outq.put((_CHUNK, res.part))


class OutputPipeline:
    """Runs chunks through every output processor's process_output_stream, in lane order.

    Stages are pipelined (chunk n+1 can be at the first processor while chunk n
    is at the second) and each stage batches whatever is queued into one stream
    message; per-chunk semantics (emit, replace, drop, abort) stay exact.
    """

    def __init__(self, caller: HookCaller, handles: list[ProcessorHandle]) -> None:
        self.caller = caller
        self.handles = [h for h in handles if h.has("process_output_stream")]

    async def run(self, source: AsyncIterator[dict[str, Any]], sink: ChunkSink) -> TripwireAbort | None:
        """Feed `source` through the stages into `sink`; return the abort that ended it, if any."""
        if not self.handles:
            async for chunk in source:
                await sink(chunk)
            return None
        queues: list[asyncio.Queue[Item]] = [asyncio.Queue() for _ in range(len(self.handles) + 1)]
        stages = [_Stage(self.caller, h, queues[i], queues[i + 1]) for i, h in enumerate(self.handles)]

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
        for stage in stages:
            tasks.append(asyncio.create_task(guard(stage.feed())))
            tasks.append(asyncio.create_task(guard(stage.forward())))
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
            for task in tasks:
                task.cancel()
            for stage in stages:
                if stage.call is not None and not stage.call.done():
                    stage.call.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
