"""What the run says to its processors and hears back, as plain data (no wire types).

The run calls processors through a `HookCaller`: one generic `call` with a hook's arguments
(`InputArgs`, `OutputStepArgs`, ...) that returns the hook's result and its effects, `fail` for a
processor's failure policy, and `stream` for the output-stream processors. Messages, chunks and
steps are the dicts the run already keeps; effects (abort, signals, custom chunks, violations)
are data the run applies. `procmesh_orchestrator.processors` implements it over gRPC; the unit
tests implement it with a fake.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from procmesh_orchestrator.errors import TripwireAbort
from procmesh_orchestrator.metrics import OrchestratorMetrics

if TYPE_CHECKING:
    from procmesh_orchestrator.run.context import ContextCheck

Chunk = dict[str, Any]
Message = dict[str, Any]
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Processor(Protocol):
    """A lane entry the run calls: one processor, or a parallel group of them."""

    @property
    def key(self) -> str:
        """Identity in the lanes: a processor listed in several lanes runs once (`dedupe`)."""
        ...

    def has(self, hook: str) -> bool:
        """Whether it implements `hook` (the seeds' name in snake_case)."""
        ...


@runtime_checkable
class Batchable(Protocol):
    """A lane entry the run may send a hook early or together with its neighbours (`run.speculation`).

    Entries without these (framework processors) are called one at a time, on final input.
    """

    @property
    def processor_id(self) -> str:
        """Its identity for state: a batch holds it once."""
        ...

    @property
    def speculative(self) -> bool:
        """It may be called before its input is final (Describe said so; its config left it on)."""
        ...

    @property
    def judged(self) -> bool:
        """It asks a judge model: cheap first, it waits for the cheap entries in front of it."""
        ...

    @property
    def fuse_key(self) -> str:
        """Neighbours with the same non-empty key may go in one request (one sidecar)."""
        ...

    @property
    def source(self) -> tuple[str, str]:
        """(sidecar, hosted processor id): its metrics' labels with the agent and `processor_id`."""
        ...


class LaneEntry(Protocol):
    """A configured lane entry; a workflow's conditional step expands to the branch a run takes."""

    def expand(self, request_context: Mapping[str, Any]) -> Sequence[Processor]:
        """The processors this entry stands for in a run with this request context."""
        ...


def expand_lane(entries: Sequence[LaneEntry], request_context: Mapping[str, Any]) -> tuple[Processor, ...]:
    """The lane a run uses: conditions are decided once, from the request context."""
    return tuple(p for entry in entries for p in entry.expand(request_context))


def dedupe(items: Sequence[Processor]) -> list[Processor]:
    """A processor listed in several lanes runs once, at its first place."""
    seen: set[str] = set()
    out = []
    for item in items:
        if item.key not in seen:
            seen.add(item.key)
            out.append(item)
    return out


class DecisionRecord(Protocol):
    """What the run asks of its decision record: to keep its inputs, and to be written to its store."""

    def keep(self, kind: str, step: int, body: Any) -> None:
        """Record something the run was given, for replay (when its agent records inputs)."""

    async def flush(
        self,
        run_id: str,
        agent_id: str,
        thread_id: str,
        resource_id: str,
        store: Callable[[], Awaitable[Any]],
    ) -> bool:
        """Write the decisions (and inputs) recorded since the last flush (one transaction); False
        when the store failed the write (logged; the run's result stands)."""


@dataclass
class RunInfo:
    """What every call of a run carries: ids, deadline, counters, and each processor's state."""

    run_id: str
    agent_id: str
    request_context: dict[str, Any]
    deadline: float | None = None
    """`time.monotonic()` by which the run must end; calls are cut at it."""
    thread_id: str = ""
    resource_id: str = ""
    step_number: int = 0
    retry_count: int = 0
    states: dict[str, object] = field(default_factory=dict)
    """Each processor's state (opaque to the run), by processor id; the caller reads and writes it."""
    fuse: bool = True
    """Neighbouring processors of one sidecar may share a request or a stream (`AgentSpec.fuse`)."""
    hook_values: dict[str, Any] = field(default_factory=dict)
    """The request-context values the run's hooks set (`run.context`), already in `request_context`;
    a snapshot keeps them apart from the caller's."""
    context_check: ContextCheck | None = None
    """The agent's requestContextSchema: a hook's values must keep the context one it accepts."""
    message_sources: dict[str, str] = field(default_factory=dict)
    """Each message's source by id (the run's message list's, live): sent in every RunContext."""
    decisions: DecisionRecord | None = None
    """The run's decision record, when the configuration keeps one (``decisions.record``): its
    caller fills it (`processors.decisions.DecisionLog`), the run writes it at its end."""


@dataclass(frozen=True)
class Violation:
    """A processor reported a policy violation (onViolation fires for it)."""

    processor_id: str
    message: str
    detail: Any = None
    source: tuple[str, str] | None = None
    """(sidecar, processor id) of the lane entry that reported it, for metric labels (None: the
    orchestrator's own processor)."""


@dataclass
class Effects:
    """A hook's effects; the run applies them in this order: signals, custom chunks, then the abort."""

    signals: list[dict[str, Any]] = field(default_factory=list)
    custom_chunks: list[Chunk] = field(default_factory=list)
    abort: TripwireAbort | None = None
    violations: list[Violation] = field(default_factory=list)
    """Recorded as soon as the call returns, whether or not its result applies (shadow mode)."""
    context: dict[str, Any] = field(default_factory=dict)
    """Request-context values the hook set; the caller applies them with its state (`run.context`)."""


@dataclass
class Reply(Generic[R]):
    """A call's answer: `result` is None when there is nothing to apply (failed open, shadow)."""

    result: R | None
    effects: Effects = field(default_factory=Effects)


@dataclass
class StreamEffects:
    """What an output-stream processor did besides its part, in stream order."""

    signals: list[dict[str, Any]] = field(default_factory=list)
    """Signal records (`messages.signal_record`), already announced downstream as data-signal chunks."""
    violations: list[Violation] = field(default_factory=list)


StreamItem = Chunk | StreamEffects | TripwireAbort
"""What the output stream yields: chunks, effects, and at most one abort, which ends it."""


class HookArgs(Generic[R_co]):
    """A hook's arguments; `R_co` is its result type."""

    hook: ClassVar[str]


# -- the hooks' arguments and results (None in a result: not replaced) -----------------------


@dataclass
class InputResult:
    messages: list[Message] | None = None
    all_messages: list[Message] | None = None
    system_messages: list[Message] | None = None


@dataclass
class InputArgs(HookArgs[InputResult]):
    hook: ClassVar[str] = "process_input"
    messages: list[Message]
    all_messages: list[Message]
    system_messages: list[Message]


@dataclass
class InputStepResult:
    messages: list[Message] | None = None
    system_messages: list[Message] | None = None
    model: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    active_tools: list[str] | None = None
    provider_options: dict[str, Any] | None = None
    model_settings: dict[str, Any] | None = None


@dataclass
class InputStepArgs(HookArgs[InputStepResult]):
    hook: ClassVar[str] = "process_input_step"
    model: str
    messages: list[Message]
    system_messages: list[Message]
    tools: list[dict[str, Any]]
    tool_choice: Any
    active_tools: list[str] | None
    provider_options: dict[str, Any]
    model_settings: dict[str, Any]
    steps: list[dict[str, Any]]


@dataclass
class LLMRequestResult:
    prompt: list[dict[str, Any]] | None = None
    cached_response: list[Chunk] | None = None
    cached_tool_results: list[dict[str, Any]] = field(default_factory=list)
    """With a cached response: its tool calls' recorded results (``toolCallId``, ``result``, ...)."""


@dataclass
class LLMRequestArgs(HookArgs[LLMRequestResult]):
    hook: ClassVar[str] = "process_llm_request"
    model: str
    prompt: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    model_spec_version: str = ""
    """The model's specification version (``v2``...; empty when it does not say)."""


@dataclass
class LLMResponseResult:
    output_result_if_clean: bool = False
    """Call this processor's processOutputResult once, at the run's clean end (see `steps.output_result`)."""


@dataclass
class LLMResponseArgs(HookArgs[LLMResponseResult]):
    hook: ClassVar[str] = "process_llm_response"
    model: str
    from_cache: bool
    chunks: list[Chunk]
    steps: list[dict[str, Any]]


@dataclass
class MessagesResult:
    messages: list[Message] | None = None


@dataclass
class OutputStepArgs(HookArgs[MessagesResult]):
    hook: ClassVar[str] = "process_output_step"
    text: str
    finish_reason: str
    messages: list[Message]
    system_messages: list[Message]
    tool_calls: list[dict[str, Any]]
    usage: dict[str, int]
    steps: list[dict[str, Any]]


@dataclass
class ToolResultResult:
    replaced: bool = False
    result: Any = None


@dataclass
class ToolResultArgs(HookArgs[ToolResultResult]):
    hook: ClassVar[str] = "process_tool_result"
    tool_name: str
    tool_call_id: str
    args: Any
    result: Any
    messages: list[Message]
    steps: list[dict[str, Any]]


@dataclass
class OutputResultArgs(HookArgs[MessagesResult]):
    hook: ClassVar[str] = "process_output_result"
    messages: list[Message]
    text: str
    finish_reason: str
    usage: dict[str, int]
    steps: list[dict[str, Any]]


@dataclass
class APIErrorResult:
    messages: list[Message] | None = None
    retry: bool = False
    retry_delay_ms: float = 0.0


@dataclass
class APIErrorArgs(HookArgs[APIErrorResult]):
    hook: ClassVar[str] = "process_api_error"
    status: int
    message: str
    body: str
    retryable: bool
    error_id: str
    details: dict[str, Any]
    messages: list[Message]
    steps: list[dict[str, Any]]


@dataclass(frozen=True)
class Suspension:
    """A tool's ``suspend(payload)`` (the seeds'): the run stops at its call until the caller
    resumes it with data; `resume_schema` (JSON text) says what data it expects."""

    payload: Any
    resume_schema: str | None = None


@dataclass(frozen=True)
class Resumed:
    """A suspended call run again: the caller's resume data and what the tool suspended with."""

    data: Any
    suspend_payload: Any


@dataclass
class ExecuteToolResult:
    result: Any = None
    error: str | None = None
    """The tool raised: what the model is told instead of a result."""
    model_output: Any = None
    """What the model sees of `result` (the tool's toModelOutput); None: `result` itself."""
    suspended: Suspension | None = None
    """The tool suspended itself (its result and error mean nothing then)."""


@dataclass
class ExecuteToolArgs(HookArgs[ExecuteToolResult]):
    hook: ClassVar[str] = "execute_tool"
    tool_name: str
    tool_call_id: str
    args: Any
    messages: list[Message]
    resumed: Resumed | None = None
    """Set when the call suspended before and the caller resumed it with data."""


class Attempt(Protocol[R]):
    """A sent hook's answer from one processor: nothing of it applies until `commit`."""

    def commit(self) -> Reply[R]:
        """Apply its state, metrics and failure policy (raises when fail-closed); its reply."""
        ...

    def discard(self) -> None:
        """Drop it: its input changed before it could apply."""
        ...


class HookCaller(Protocol):
    """The run's processors, for one run (built by a `CallerFactory` from its `RunInfo`)."""

    async def call(self, item: Processor, args: HookArgs[R]) -> Reply[R]:
        """Call a unary hook; failures follow the processor's policy (raise, or an empty reply)."""
        ...

    def send(
        self, group: Sequence[Processor], args: HookArgs[R], *, speculative: bool = False
    ) -> asyncio.Task[list[Attempt[R]]]:
        """Start a hook on `group` (several `Batchable` entries of one `fuse_key`: one request).

        The attempts are those of the processors that ran, in order; `speculative` counts them
        in the speculative-call metrics when they commit or are discarded.
        """
        ...

    def fail(self, item: Processor, hook: str, cause: str) -> None:
        """Apply `item`'s failure policy to a failure the run found (raises when fail-closed)."""
        ...

    def export_states(self) -> dict[str, Any]:
        """Every processor's state as JSON (a suspended run's snapshot keeps it)."""
        ...

    def import_states(self, states: dict[str, Any]) -> None:
        """Put back states `export_states` gave (a resumed run)."""
        ...

    def stream(
        self, lane: Sequence[Processor], source: AsyncIterator[Chunk], *, announce_signals: bool
    ) -> AsyncGenerator[StreamItem, None]:
        """Run `source` through the lane's process_output_stream processors, in order.

        Yields the chunks that come out, the effects of each part in stream order and,
        when a processor aborts, the abort (nothing follows it). A fail-closed failure,
        or the source's own, is raised. With `announce_signals`, each signal also goes
        downstream as a data-signal chunk.
        """
        ...

    def rehearse(
        self, lane: Sequence[Processor], source: AsyncIterator[Chunk], *, announce_signals: bool
    ) -> RehearsedStream:
        """`stream`, started now on a guess of `source` (`run.optimistic`): what it gives is
        held until the run adopts it, and nothing of it reaches the run if it is cancelled."""
        ...


class RehearsedStream(Protocol):
    """An output stream run ahead on a guess (`HookCaller.rehearse`)."""

    def stands(self) -> bool:
        """Whether its sessions opened as they would open now (then what they answered stands)."""
        ...

    def adopt(self) -> AsyncGenerator[StreamItem, None]:
        """What it held, in order, then the rest as it comes (as `HookCaller.stream` gives it)."""
        ...

    async def cancel(self) -> None:
        """Stop it; nothing more of it is held or given."""
        ...


CallerFactory = Callable[[RunInfo, OrchestratorMetrics], HookCaller]
"""Builds a run's `HookCaller`; the caller counts and times its calls on the metrics object."""
