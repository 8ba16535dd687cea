"""One run's state and how effects apply to it: messages, violations, aborts, chunks to the caller."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from procmesh_orchestrator.errors import TripwireAbort
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import context, violation_routes
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.framework import FrameworkProcessor
from procmesh_orchestrator.run.framework.cost import CostSlot
from procmesh_orchestrator.run.framework.prepare_step import PrepareStep
from procmesh_orchestrator.run.hooks import (
    Attempt,
    Chunk,
    Effects,
    HookArgs,
    Processor,
    Reply,
    RunInfo,
    StreamEffects,
    StreamItem,
    Violation,
    expand_lane,
)
from procmesh_orchestrator.run.messages import RunMessages
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.run.tools import ClientTool, Tool
from procmesh_orchestrator.run.types import AgentSpec, CallOptions, choosing_context

if TYPE_CHECKING:
    from procmesh_orchestrator.run.chunk_buffer import ChunkBuffer
    from procmesh_orchestrator.run.steps import StepOutcome
    from procmesh_orchestrator.run.tool_calls import Decision, PendingTools
    from procmesh_orchestrator.store import RunFence

log = logging.getLogger(__name__)

R = TypeVar("R")

TALLY = 64
"""Chunks of an output stream counted at once in the emitted-chunks metric (`RunCore.take_output`):
a count per chunk was 3% of the orchestrator's CPU in a 1,000-delta run."""
ChunkSink = Callable[[Chunk], None]
Checkpoint = Callable[["RunCore", int], Awaitable[None]]
"""Where a streamed run's chunks go (the `RunStream`'s queue); None for generate()."""


def call_lanes(
    agent: AgentSpec, options: CallOptions
) -> tuple[tuple[Processor, ...], tuple[Processor, ...], tuple[Processor, ...]]:
    """The input, output and error lanes a run of `options` calls, memory's processors aside.

    Per-call lists replace the agent's (static, chosen from the request context or built by its
    lane function, which is then not called); workflow conditions, options taken from the request
    context and lane functions are decided here, as a run starts (and as an API admits its
    request, `Agent.check_call`): RequestContextError when the context gives a processor an option
    its schema refuses, or a lane function refuses it. They see the caller's context with the
    run's resource under ``resourceId`` (`types.choosing_context`).
    """
    rc, owner = choosing_context(options), f"agent {agent.id!r}"
    return (
        expand_lane(
            options.input_processors
            if options.input_processors is not None
            else agent.lanes.chosen("input", rc, owner),
            rc,
        ),
        expand_lane(
            options.output_processors
            if options.output_processors is not None
            else agent.lanes.chosen("output", rc, owner),
            rc,
        ),
        expand_lane(
            options.error_processors if options.error_processors is not None else agent.lanes.error, rc
        ),
    )


class RunCore:
    """What one generate()/stream() call holds, and the effects every hook step applies."""

    def __init__(
        self,
        agent: AgentSpec,
        input: str | list[dict[str, Any]],
        options: CallOptions,
        *,
        sink: ChunkSink | None,
        metrics: OrchestratorMetrics,
        run_id: str | None = None,
    ) -> None:
        self.agent = agent
        self.input = input
        self.options = options
        self.streaming = sink is not None
        self._sink = sink
        self.reader: ChunkBuffer | None = None
        """A `RunStream`'s bounded buffer: after each chunk of the output stream the run waits
        while it is full (`ChunkBuffer.room`), so a reader that does not read pauses the model
        stream."""
        self._tally: dict[str, int] | None = None
        """Chunks emitted and not counted yet, by type, while an output stream runs
        (`take_output` counts them once per `TALLY` chunks: the metric per batch, not per part)."""
        self.metrics = metrics
        self.run_id = run_id or options.run_id or str(uuid.uuid4())
        self.violations: list[dict[str, Any]] = []
        self.info = RunInfo(
            run_id=self.run_id,
            agent_id=agent.id,
            request_context=options.request_context,
            deadline=time.monotonic() + options.timeout if options.timeout else None,
            thread_id=options.thread_id,
            resource_id=options.resource_id,
            fuse=agent.fuse,
            context_check=agent.context_schema,
        )
        self.caller = agent.hook_caller(self.info, metrics)
        self.record_input("input", 0, input)
        self.record_input("request-context", 0, options.request_context)
        self.input_lane, self.output_lane, self.error_lane = call_lanes(agent, options)
        # Memory's processors run around the lanes, per-call lists included (SPEC §3, §5).
        self.memory = (
            agent.memory.for_call(options.thread_id, options.resource_id, options.memory)
            if agent.memory
            else None
        )
        if self.memory is not None:
            self.input_lane = (*self.memory.input_processors, *self.input_lane)
            self.output_lane = (*self.output_lane, self.memory.history)
            self.error_lane = (*self.error_lane, self.memory.recovery)
        # Cost control checks the model calls your input processors prepared (`run.framework.cost`),
        # at its token-cost-control entry's place, else (costControl, a per-call lane) last.
        self.cost = agent.cost.for_call(self) if agent.cost is not None else None
        if self.cost is not None and not any(isinstance(p, CostSlot) for p in self.input_lane):
            self.input_lane = (*self.input_lane, self.cost)
        # prepareStep runs after the input lane's processInputStep, as the reference places it
        for source in (options.prepare_steps, options.prepare_step):
            if source:
                self.input_lane = (*self.input_lane, PrepareStep(source))
        self.ml = RunMessages()
        self.info.message_sources = self.ml.sources  # RunContext.message_sources: the SDKs' views
        self.system: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.usage = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}
        self.max_steps = options.max_steps or agent.max_steps
        self.max_retries = (
            options.max_processor_retries
            if options.max_processor_retries is not None
            else agent.max_processor_retries
        )
        self.memory_tools: dict[str, Tool] = dict(self.memory.tools) if self.memory is not None else {}
        """What memory offers the model (``updateWorkingMemory``), run in process."""
        self.tools: dict[str, Tool] = {
            **self.memory_tools,
            **agent.tools,
            **{t.name: t for t in options.client_tools},
        }
        """The tools this run can call, by name: memory's, the agent's, the caller's client tools,
        and those processors add to a step and run themselves (ExecuteTool)."""
        self.awaiting_client = False
        """A client tool was called: the run ends for the caller to run it and continue."""
        self.current_step: StepOutcome | None = None
        """The step being streamed: its text so far is what an aborted run keeps (`partial_text`)."""
        self.stop_when = tuple(options.stop_when) if options.stop_when is not None else agent.stop_when
        self.loop_system: list[dict[str, Any]] = []
        """The system messages each step starts from (after processInput)."""
        self.resume_from: tuple[PendingTools, Decision] | None = None
        """A resumed run: the suspended step's calls left, and the decision for the first."""
        self.unsettled_results: list[dict[str, Any]] = []
        """Client tool results in the input whose call is not (yet) in the conversation."""
        self.resume_step: int | None = None
        """A durable run taken over at a step boundary: the step it goes on with."""
        self.checkpoint: Checkpoint | None = None
        """Called at each step boundary with the next step's number (a durable run saves its
        snapshot there); None for a run that is not durable."""
        self.fence: RunFence | None = None
        """A durable run's claim on its writes (its id and the epoch this replica holds): its memory
        save, suspension and cost reservations pass it to the store, which refuses them once
        another replica claimed the run. None for a run that is not durable."""
        self.on_fenced: Callable[[str, BaseException], None] | None = None
        """Told of a write the store refused for the fence (`fenced`): the durable runner stops the run."""
        self.pending_approvals: list[dict[str, Any]] = []
        """A suspended run: the call awaiting a decision."""
        self.model_requests: list[ModelRequest] = []
        self.at_clean_end: list[Processor] = []
        """Processors whose processOutputResult waits for the run's clean end (`steps.output_result`)."""
        self.object: Any = None
        """The structured output's value (`CallOptions.structured_output`)."""
        self.structured_error: str | None = None
        """Why the answer did not match the structured output's schema (strict: the run failed)."""
        self.used_fallback_value = False
        """`object` is the structured output's fallback value: the answer did not match."""

    async def record_decisions(self) -> None:
        """Write the decisions recorded since the run (or its resumption) began to the store, in
        one transaction: at the run's end, a suspension included (`DecisionLog.flush`). A write
        the store fails is logged and counted (``procmesh_store_writes_failed_total``), the run's
        result stands."""
        decisions, store, info = self.info.decisions, self.agent.store, self.info
        if decisions is not None and store is not None:
            for step in self.steps:  # each finished step's tool results, as the run gave them on
                if step.get("toolResults"):
                    self.record_input("tool-results", int(step.get("stepNumber", 0)), step["toolResults"])
            if not await decisions.flush(self.run_id, self.agent.id, info.thread_id, info.resource_id, store):
                self.metrics.store_writes_failed.labels(self.agent.id, "decision-record").inc()

    def record_input(self, kind: str, step: int, body: Any) -> None:
        """Keep what the run was given, for replay (``agents.ID.recordInputs``): nothing without."""
        if self.info.decisions is not None:
            self.info.decisions.keep(kind, step, body)

    def offered_tools(self) -> list[Tool]:
        """What each step starts by offering the model: the agent's tools and the caller's client
        tools (a processor's processInputStep adds its own, every step, and runs them)."""
        offered = (*self.memory_tools, *self.agent.tools)
        return [t for name, t in self.tools.items() if name in offered or isinstance(t, ClientTool)]

    def needs_approval(self, tool: Tool) -> bool:
        """Whether a call of `tool` waits for approval (the call's setting overrides the tool's)."""
        if self.options.require_tool_approval is not None:
            return self.options.require_tool_approval
        return tool.requires_approval

    # -- calls and their effects --------------------------------------------------------

    async def call(self, item: Processor, args: HookArgs[R]) -> tuple[R, Effects] | None:
        """Call a hook; its violations are recorded at once; None when there is nothing to apply."""
        if isinstance(item, FrameworkProcessor):
            result = await item.run_hook(self, args)
            return None if result is None else (result, Effects())
        reply = await self.caller.call(item, args)
        self._record(reply.effects.violations)
        if reply.result is None:
            return None
        return reply.result, reply.effects

    def commit(self, attempt: Attempt[R]) -> Reply[R]:
        """Apply a sent hook's answer (`run.speculation`); its violations are recorded now."""
        reply = attempt.commit()
        self._record(reply.effects.violations)
        return reply

    def _record(self, violations: list[Violation]) -> None:
        for v in violations:
            self.violation(v.processor_id, v.message, v.detail, v.source)

    def violation(
        self, processor_id: str, message: str, detail: Any, source: tuple[str, str] | None = None
    ) -> None:
        """Record a violation; the caller's onViolation sees it (its failure is logged, not raised).
        `source`: (sidecar, processor id) of the lane entry, for the metric (None: the orchestrator's)."""
        entry = {"processorId": processor_id, "message": message, "detail": detail}
        self.violations.append(entry)
        self.metrics.violation(self.agent.id, processor_id, source)
        if self.options.announce_violations:  # a remote caller's stream tells it as it happens
            self.emit({"type": "data-procmesh-violation", "data": entry, "transient": True})

        def failed() -> None:  # a route, or the caller's callback, did not take it
            self.metrics.violation_routes_failed.labels(self.agent.id, processor_id).inc()

        violation_routes.for_caller(self.options.on_violation, entry, failed)
        route = self.agent.violation_routes.get(processor_id)
        violation_routes.deliver(route, entry, self.agent.id, self.run_id, failed)

    def fenced(self, write: str, exc: BaseException) -> None:
        """A write of this run (``memory``, ``suspension``, ``cost``) was refused for its fence:
        another replica holds the run now; this replica stops it (`on_fenced`)."""
        if self.on_fenced is not None:
            self.on_fenced(write, exc)

    @property
    def partial_text(self) -> str:
        """The text of the step being streamed so far (an aborted run keeps it)."""
        return self.current_step.text if self.current_step is not None else ""

    def aborted(self, abort: TripwireAbort) -> TripwireAbort:
        """Record an abort (onViolation fires for every abort) and return it to raise."""
        self.metrics.tripwire(self.agent.id, abort)
        self.violation(abort.processor_id, abort.reason, abort.metadata, abort.source)
        return abort

    def emit(self, chunk: Chunk) -> None:
        """Send a chunk to the caller (stream only); a client tool's call carries the request
        context (`context.for_client`)."""
        if self._sink is not None:
            kind = chunk["type"]
            if kind == "tool-call":
                chunk = context.for_client(self, chunk)
            tally = self._tally
            if tally is None:
                self.metrics.chunk_emitted(kind)
            else:
                tally[kind] = tally.get(kind, 0) + 1
            self._sink(chunk)

    def stream_lane(self) -> list[Processor]:
        """The output lane as its stream runs it (the run's own processors stream nothing)."""
        return [p for p in self.output_lane if not isinstance(p, FrameworkProcessor)]

    async def through_output(
        self, source: AsyncIterator[Chunk], on_chunk: Callable[[Chunk], None]
    ) -> TripwireAbort | None:
        """Run chunks through the output-stream processors; the abort that stopped them, if any."""
        stream = self.caller.stream(self.stream_lane(), source, announce_signals=self.streaming)
        return await self.take_output(stream, on_chunk)

    async def take_output(
        self, stream: AsyncGenerator[StreamItem, None], on_chunk: Callable[[Chunk], None]
    ) -> TripwireAbort | None:
        """Apply what the output stream gives (`HookCaller.stream`'s items) in order: chunks to
        `on_chunk`, effects to the run; the abort that ended it, if any. The chunks emitted
        meanwhile are counted per `TALLY` (`emit`)."""
        reader, outer = self.reader, self._tally
        tally = self._tally = {} if outer is None else outer
        since = 0
        try:
            async with contextlib.aclosing(stream) as items:
                async for item in items:
                    if isinstance(item, dict):
                        on_chunk(item)
                        if reader is not None and reader.full:
                            await reader.room()
                        since += 1
                        if since == TALLY and outer is None:
                            self._count(tally)
                            since = 0
                    elif isinstance(item, StreamEffects):
                        for record in item.signals:
                            self.ml.add_signal_record(record)
                        self._record(item.violations)
                    else:
                        return item
            return None
        finally:
            if outer is None:
                self._tally = None
                self._count(tally)

    def _count(self, tally: dict[str, int]) -> None:
        """Count the chunks `emit` tallied (`chunk_emitted`), and forget them."""
        for kind, n in tally.items():
            self.metrics.chunk_emitted(kind, n)
        tally.clear()

    async def emit_chunks(self, chunks: list[Chunk]) -> None:
        """Custom chunks and signals from hooks: through the output processors, then to the caller."""
        if not chunks or not self.streaming:
            return

        async def source() -> AsyncIterator[Chunk]:
            for chunk in chunks:
                yield chunk

        abort = await self.through_output(source(), self.emit)
        if abort is not None:
            raise self.aborted(abort)

    async def apply(self, effects: Effects, *, can_stream: bool = True) -> None:
        """Apply a unary hook's effects in order: signals, custom chunks, then the abort."""
        out: list[Chunk] = []
        for signal in effects.signals:
            _, data = self.ml.add_signal(signal)
            out.append({"type": "data-signal", "data": data, "transient": True})
        out.extend(effects.custom_chunks)
        if can_stream:
            await self.emit_chunks(out)
        if effects.abort is not None:
            raise self.aborted(effects.abort)

    @contextlib.contextmanager
    def at_step(self, step_number: int) -> Iterator[None]:
        """Calls made inside carry this step number and retry count 0 (processToolResult's)."""
        saved = self.info.step_number, self.info.retry_count
        self.info.step_number, self.info.retry_count = step_number, 0
        try:
            yield
        finally:
            self.info.step_number, self.info.retry_count = saved

    def text(self) -> str:
        """generate: every step's text joined; stream: the last step's text (as the reference reports)."""
        texts = [msgs.message_text(m) for m in self.ml.view(msgs.RESPONSE) if m.get("role") == "assistant"]
        if not texts:
            return ""
        return "".join(texts) if not self.streaming else texts[-1]
