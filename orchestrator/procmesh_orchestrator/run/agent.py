"""`Agent`: generate() and stream() as in the seeds; `RunStream`: a streamed run's chunks and result."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.errors import OrchestratorError, SuspendedRunNotFoundError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import snapshot
from procmesh_orchestrator.run.base import call_lanes
from procmesh_orchestrator.run.chunk_buffer import ChunkBuffer
from procmesh_orchestrator.run.context import ContextSchema
from procmesh_orchestrator.run.framework import prepare_step, working_memory
from procmesh_orchestrator.run.hooks import Chunk, Resumed
from procmesh_orchestrator.run.loop import Run
from procmesh_orchestrator.run.tool_calls import ApprovalDecision, Decision
from procmesh_orchestrator.run.types import AgentSpec, CallOptions, RunResult, choosing_context

if TYPE_CHECKING:
    from procmesh_orchestrator.store import MemoryStore

_STREAM_END = object()
_NO_DATA = object()


def _abortable(options: CallOptions | None) -> CallOptions:
    """The options with an abort signal (the caller's, or a new one `RunStream.cancel` sets)."""
    options = options or CallOptions()
    return options if options.abort_signal is not None else replace(options, abort_signal=asyncio.Event())


class RunStream:
    """A streamed run: iterate for chunks, then `await result()` (or await it directly)."""

    def __init__(self, run: Run, queue: ChunkBuffer, *, store: MemoryStore | None = None) -> None:
        self._queue = queue
        self._run = run
        run.reader = queue  # the run pauses while its reader is far behind
        self._store = store
        """A resumed run's store: the suspended record goes once the run is done."""
        self._task = asyncio.create_task(self._drive())

    @property
    def resource_id(self) -> str:
        """The resource the run is for ("" when none; a resumed run's is its snapshot's)."""
        return self._run.info.resource_id

    async def _drive(self) -> RunResult:
        try:
            result, failure = await self._run.execute()
            if self._store is not None and result.status != "suspended":
                await self._store.finish_suspended(result.run_id)  # resumed, and done
            if failure is not None and not self._run.streaming:
                if isinstance(failure, OrchestratorError):
                    failure.result = result
                raise failure
            return result
        finally:
            self._queue.put_nowait(_STREAM_END)

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Chunk]:
        while True:
            item = await self._queue.get()
            if item is _STREAM_END:
                return
            yield item

    async def result(self) -> RunResult:
        """The run's result. The run no longer waits for its chunks to be read; a reader still
        iterating gets every one of them, the last included (`abort`, `finish`)."""
        self._queue.unbound()
        return await self._task

    def detach(self) -> None:
        """The reader is gone: the chunks not read are dropped and the run no longer pauses for
        them (a streamed run waits while `chunk_buffer.DEFAULT_LIMIT` chunks are unread)."""
        self._queue.discard()

    async def cancel(self) -> RunResult:
        """Abort the run (its abort signal): in-flight calls are cancelled, the stream ends with an
        ``abort`` chunk, and the result (returned) keeps the text and steps done so far."""
        signal = self._run.options.abort_signal
        assert signal is not None  # Agent.stream always gives one
        signal.set()
        return await self._task


class Agent:
    """An agent bound to its processors: `generate()` and `stream()` as in the seeds."""

    def __init__(self, spec: AgentSpec, metrics: OrchestratorMetrics | None = None) -> None:
        self.spec = spec
        self.metrics = metrics or OrchestratorMetrics()
        self.context_schema = (
            None
            if spec.request_context_schema is None
            else ContextSchema.of(
                spec.id, spec.request_context_schema, f"agent {spec.id!r} requestContextSchema"
            )
        )
        """The compiled `AgentSpec.request_context_schema` (ConfigError here when it is no schema)."""

    def check_context(self, options: CallOptions) -> None:
        """RequestContextError naming the keys when the call's request context is not one the
        agent's requestContextSchema accepts (nothing to check without one)."""
        if self.context_schema is not None:
            self.context_schema.check(options.request_context)

    def check_call(self, options: CallOptions) -> None:
        """Refuse, before a run starts, what the run would refuse before its first hook: a request
        context the agent's requestContextSchema refuses, or one giving a processor an option its
        schema refuses or costControl a limit that is none (RequestContextError); a prepareSteps
        model the agent cannot call (StepModelError). The APIs call it while they admit a request,
        so the caller gets a 400, not a failed run."""
        self.check_context(options)
        call_lanes(self.spec, options)
        if self.spec.cost is not None:
            self.spec.cost.limit_for(choosing_context(options))
        prepare_step.check_models(options.prepare_steps, self.spec.models)

    async def generate(
        self, input: str | list[dict[str, Any]], options: CallOptions | None = None
    ) -> RunResult:
        """Run to completion. Raises `APICallError` or `ProcessorFailedError` when the run fails,
        `RequestContextError` (before any processor is called) for a request context it refuses."""
        self.check_context(options or CallOptions())
        run = Run(self.spec, input, options or CallOptions(), sink=None, metrics=self.metrics)
        result, failure = await run.execute()
        if failure is not None:
            if isinstance(failure, OrchestratorError):
                failure.result = result  # what the run did before it failed (run id, steps, usage)
            raise failure
        return result

    def stream(self, input: str | list[dict[str, Any]], options: CallOptions | None = None) -> RunStream:
        """Start a streamed run; failures end the stream with an ``error`` chunk
        (`RequestContextError` is raised here, before the run starts)."""
        self.check_context(options or CallOptions())
        queue = ChunkBuffer()
        run = Run(self.spec, input, _abortable(options), sink=queue.put_nowait, metrics=self.metrics)
        return RunStream(run, queue)

    async def get_working_memory(self, resource_id: str, thread_id: str = "") -> str | None:
        """The agent's working memory for `resource_id` (its thread `thread_id`, when the working
        memory is thread-scoped), or None. `InvalidMemoryInputError` when it has none configured."""
        return await working_memory.read(self.spec.id, self.spec.memory, resource_id, thread_id)

    async def update_working_memory(self, resource_id: str, text: str, thread_id: str = "") -> None:
        """Replace the agent's working memory for `resource_id` (or its thread) with `text`."""
        await working_memory.write(self.spec.id, self.spec.memory, resource_id, text, thread_id)

    async def approve_tool_call(
        self,
        run_id: str,
        tool_call_id: str | None,
        options: CallOptions | None = None,
        *,
        resource_id: str | None = None,
    ) -> RunResult:
        """Resume a run suspended for this call's approval: the tool runs, the loop goes on.

        Works on any replica sharing the store. `ResumeConflictError` when the call was already
        decided (or is being resumed elsewhere), `SuspendedRunNotFoundError` when no run waits (or,
        given `resource_id`, the run is another resource's: answered as a missing one).
        """
        resumed = await self._resume(
            run_id, tool_call_id, ApprovalDecision(True), options, streaming=False, resource_id=resource_id
        )
        return await resumed.result()

    async def decline_tool_call(
        self,
        run_id: str,
        tool_call_id: str | None,
        reason: str | None = None,
        options: CallOptions | None = None,
        *,
        resource_id: str | None = None,
    ) -> RunResult:
        """Resume a run suspended for this call's approval: the model is told it was declined."""
        resumed = await self._resume(
            run_id,
            tool_call_id,
            ApprovalDecision(False, reason),
            options,
            streaming=False,
            resource_id=resource_id,
        )
        return await resumed.result()

    async def resume_generate(
        self,
        run_id: str,
        tool_call_id: str | None,
        resume_data: Any,
        options: CallOptions | None = None,
        *,
        resource_id: str | None = None,
    ) -> RunResult:
        """Resume a run whose tool call suspended itself (the seeds' ``suspend(payload)``; the
        result's `RunResult.suspended` lists it with its ``suspendPayload``): the tool runs again
        and sees `resume_data` (the seeds' ``resumeData``), and the loop goes on. Refused as
        `approve_tool_call` is; `tool_call_id` None takes the run's only awaited call (a run
        awaiting several is `InvalidMemoryInputError`, naming them); `ResumeMismatchError` when
        the call awaits an approval and `resume_data` is not ``{"approved": bool, "reason"?: str}``
        (that is the decision).
        """
        resumed = await self._resume(
            run_id,
            tool_call_id,
            Resumed(resume_data, None),
            options,
            streaming=False,
            resource_id=resource_id,
        )
        return await resumed.result()

    async def resume_stream(
        self,
        run_id: str,
        tool_call_id: str | None,
        *,
        approved: bool | None = None,
        reason: str | None = None,
        resume_data: Any = _NO_DATA,
        options: CallOptions | None = None,
        resource_id: str | None = None,
    ) -> RunStream:
        """`approve_tool_call` / `decline_tool_call` (`approved`), or `resume_generate`
        (`resume_data`), streamed: give one of the two."""
        if (approved is None) == (resume_data is _NO_DATA):
            raise TypeError("resume_stream takes either approved= or resume_data=")
        decision: Decision = (
            Resumed(resume_data, None) if approved is None else ApprovalDecision(approved, reason)
        )
        return await self._resume(
            run_id, tool_call_id, decision, options, streaming=True, resource_id=resource_id
        )

    async def _resume(
        self,
        run_id: str,
        tool_call_id: str | None,
        decision: Decision,
        options: CallOptions | None,
        *,
        streaming: bool,
        resource_id: str | None = None,
    ) -> RunStream:
        if self.spec.store is None:
            raise SuspendedRunNotFoundError(f"agent {self.spec.id!r} keeps no suspended runs (no store)")
        store = await self.spec.store()
        saved = await store.claim_suspended(run_id, tool_call_id, resource_id=resource_id)
        if saved.agent_id != self.spec.id:
            await store.release_suspended(run_id)
            raise SuspendedRunNotFoundError(f"run {run_id!r} is not a run of agent {self.spec.id!r}")
        queue = ChunkBuffer()
        try:
            # held to a generate's rule: the context the resumed run goes on with (the snapshot's,
            # the resuming call's keys over it) is one the agent's requestContextSchema accepts
            context = snapshot.resumed_context(saved.snapshot, options or CallOptions())
            self.check_context(replace(options or CallOptions(), request_context=context))
            run = Run.resume(
                self.spec,
                saved.snapshot,
                decision,
                _abortable(options),
                sink=queue.put_nowait if streaming else None,
                metrics=self.metrics,
            )
        except BaseException:
            await store.release_suspended(run_id)  # nothing changed: it may be resumed again
            raise
        return RunStream(run, queue, store=store)
