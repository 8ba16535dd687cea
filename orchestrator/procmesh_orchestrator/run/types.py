"""The values a run is built from and gives back: the agent, per-call options, the result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.errors import ConfigError, OrchestratorError
from procmesh_orchestrator.run.framework.memory import AgentMemory, MemoryCallOptions
from procmesh_orchestrator.run.framework.prepare_step import PrepareStepFunction, StepRule
from procmesh_orchestrator.run.hooks import CallerFactory, LaneEntry
from procmesh_orchestrator.run.models import ModelProvider
from procmesh_orchestrator.run.stop import StopCondition
from procmesh_orchestrator.run.tools import ClientTool, Tool

if TYPE_CHECKING:
    import asyncio

    from procmesh_orchestrator.run.context import ContextCheck
    from procmesh_orchestrator.run.framework.cost import CostControl
    from procmesh_orchestrator.run.violation_routes import Route
    from procmesh_orchestrator.store import MemoryStore

ViolationCallback = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class ContextLane:
    """A lane chosen per call from the request context (the seeds' ``inputProcessors:
    ({ requestContext }) => [...]``): ``cases[V]`` when ``requestContext[key]`` is the string V,
    else `default`."""

    key: str
    cases: Mapping[str, tuple[LaneEntry, ...]]
    default: tuple[LaneEntry, ...] = ()

    def choose(self, request_context: Mapping[str, Any]) -> tuple[LaneEntry, ...]:
        value = request_context.get(self.key)
        return self.cases.get(value, self.default) if isinstance(value, str) else self.default

    def every(self) -> tuple[LaneEntry, ...]:
        """Every entry it may choose, cases first, then the default."""
        return tuple(e for lane in (*self.cases.values(), self.default) for e in lane)


LaneFunction = Callable[[Mapping[str, Any]], Sequence[LaneEntry]]
"""A lane built per run from the caller's request context, as in the seeds (``inputProcessors:
({ requestContext }) => [...]``): it gets a read-only copy of the context and returns bound
entries (`App`'s ``lanes=`` binds the entries a function of yours names)."""


@dataclass(frozen=True)
class Lanes:
    """The resolved processor lanes of a call."""

    input: tuple[LaneEntry, ...] | LaneFunction = ()
    """The input lane, or a `LaneFunction` called as each run starts, before processInput."""
    output: tuple[LaneEntry, ...] | LaneFunction = ()
    """The output lane, or a `LaneFunction` called as each run starts, before processInput."""
    error: tuple[LaneEntry, ...] = ()
    input_by_context: ContextLane | None = None
    """Chosen per call instead of `input` (the config's ``inputProcessorsByContext``)."""
    output_by_context: ContextLane | None = None
    """Chosen per call instead of `output` (the config's ``outputProcessorsByContext``)."""

    def chosen(
        self, lane: str, request_context: Mapping[str, Any], owner: str = "the agent"
    ) -> tuple[LaneEntry, ...]:
        """The ``input`` or ``output`` lane (`lane`) of a call with this request context.

        A lane function that raises fails the run before any hook: a `RequestContextError` (the
        function's way to refuse a context: 400 over the APIs) or another `OrchestratorError` as
        it is, anything else as a ConfigError naming `owner`'s lane.
        """
        by_context = self.input_by_context if lane == "input" else self.output_by_context
        if by_context is not None:
            return by_context.choose(request_context)
        entries = self.input if lane == "input" else self.output
        return _built(f"{owner}'s {lane} lane", entries, request_context) if callable(entries) else entries

    def every(self) -> tuple[LaneEntry, ...]:
        """Every input and output entry any call may get (each case of a lane chosen by context;
        none of a lane function's, which exist only per run)."""
        ins = self.input if self.input_by_context is None else self.input_by_context.every()
        outs = self.output if self.output_by_context is None else self.output_by_context.every()
        return tuple(e for lane in (ins, outs) if not callable(lane) for e in lane)


def _built(lane: str, function: LaneFunction, request_context: Mapping[str, Any]) -> tuple[LaneEntry, ...]:
    try:
        # A copy: the caller's context is the run's, and a lane function only reads it.
        built = function(MappingProxyType(dict(request_context)))
    except OrchestratorError:
        raise
    except Exception as exc:
        raise ConfigError(f"{lane}: its function raised {exc!r}") from exc
    if isinstance(built, str | bytes) or not isinstance(built, Sequence):
        raise ConfigError(f"{lane}: its function returned {type(built).__name__}, not a list")
    for i, entry in enumerate(built):
        if not callable(getattr(entry, "expand", None)):
            raise ConfigError(
                f"{lane}: its function returned {entry!r} at {i}, not a bound lane entry "
                "(bind it with App.resolve, or give App the function as lanes=)"
            )
    return tuple(built)


def choosing_context(options: CallOptions) -> dict[str, Any]:
    """What a run's lanes, conditions and options are chosen from: the caller's request context,
    and the run's resource (over the APIs the one its API key is bound to) under ``resourceId``,
    a reserved key neither a caller nor a hook can set, so a tenant's lanes follow its key.
    Hooks and tools get the caller's context as it is (and the resource apart)."""
    if not options.resource_id:
        return options.request_context
    return {**options.request_context, "resourceId": options.resource_id}


@dataclass
class AgentSpec:
    """A resolved agent: what the loop needs, with processors bound to their sidecars."""

    id: str
    model: ModelProvider
    hook_caller: CallerFactory
    """Builds each run's caller of the processors (`procmesh_orchestrator.processors.GrpcHookCaller`)."""
    instructions: str = ""
    models: dict[str, ModelProvider] = field(default_factory=dict)
    tools: dict[str, Tool] = field(default_factory=dict)
    max_steps: int = 5
    tool_call_concurrency: int = 10
    """How many tool calls of one model step run at once (`toolCallConcurrency`; 1: one by one)."""
    stop_when: tuple[StopCondition, ...] = ()
    """End the loop after a step when any holds (`run.stop`); maxSteps still caps it."""
    max_processor_retries: int | None = None
    lanes: Lanes = field(default_factory=Lanes)
    """The resolved lanes; `error` already holds the default error processors (SPEC §5)."""
    memory: AgentMemory | None = None
    """Message-history memory; a call with a thread loads and saves through it."""
    store: Callable[[], Awaitable[MemoryStore]] | None = None
    """Opens (once) the store where a run suspended for a tool approval is kept until it resumes,
    on any replica sharing it; the App opens its configured `storage` on first use."""
    fuse: bool = True
    """Neighbouring processors of one sidecar that runs fused requests go in one request."""
    optimistic_first_step: bool = False
    """The first model call starts while the input processors still run (`run.optimistic`)."""
    fallbacks: tuple[ModelProvider, ...] = ()
    """The models after `model`, in order: when a call fails and the error processors do not
    recover it, the next one gets its turn (each with its own retries, `ModelChoice.max_retries`)."""
    cost: CostControl | None = None
    """The agent's spending limit (`costControl`): checked before each model call, updated after."""
    context_schema: ContextCheck | None = None
    """The agent's compiled requestContextSchema: the request-context values a run's hooks set must
    keep the context one it accepts (`run.context`)."""
    request_context_schema: Mapping[str, Any] | None = None
    """JSON Schema of the request context the agent accepts (`config.request_context`): a run
    whose context misses a required key, has a key it does not declare or a value of the wrong
    shape fails before any processor is called (RequestContextError naming the keys)."""
    bind_lanes: Callable[[Mapping[str, Sequence[str]]], dict[str, list[LaneEntry]]] | None = None
    """Binds per-call processor lists by name (`call_lanes.bind`): a resumed run's snapshot keeps
    the names; ConfigError naming an entry this orchestrator cannot bind."""
    pin: Callable[[], AbstractContextManager[object]] | None = None
    """Held by each run from start to end: the App's pipeline counts its runs, so a reload closes
    the old sidecar channels only after the runs that use them (`app._pipeline.Pipeline.pin`)."""
    ended: Callable[[str], object] | None = None
    """Told each run's id as the run ends, however it started (`App.run_ended`: the model gateway
    cancels the judge questions the run's guards still have in flight)."""
    attempt_failed: Callable[[str], object] | None = None
    """Told a run's id when one of its model calls failed, before the error processors are asked
    (`App.attempt_failed`: the model gateway cancels the judge questions the failed attempt's
    guards still have in flight; the retried attempt asks its own)."""
    warned_implicit_cap: bool = False
    violation_routes: Mapping[str, Route] = field(default_factory=dict)
    """Each processor instance's own onViolation (the seeds' per-processor property), by the id
    its violations carry: ``log``, a webhook, or a callable (`run.violation_routes`)."""


@dataclass
class CallOptions:
    """Per-call options; None means the agent's value. A lane list replaces the agent's."""

    max_steps: int | None = None
    max_processor_retries: int | None = None
    input_processors: Sequence[LaneEntry] | None = None
    output_processors: Sequence[LaneEntry] | None = None
    error_processors: Sequence[LaneEntry] | None = None
    processor_names: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """The per-call lists as the caller named them, by lane (``input``, ``output``, ``error``): a
    snapshot keeps these, and the orchestrator that resumes the run binds them again."""
    request_context: dict[str, Any] = field(default_factory=dict)
    on_violation: ViolationCallback | Mapping[str, ViolationCallback] | None = None
    """Called with each violation; a mapping calls only the callable of the violation's processor id."""
    timeout: float | None = None
    """Seconds the whole run may take; propagates to every processor call as its deadline."""
    resource_id: str = ""
    """Who the run is for (a user, an org): processors get it (response-cache scopes by it), and
    memory's thread belongs to it."""
    thread_id: str = ""
    """The conversation the run belongs to: with agent memory, the run loads its history and
    saves its turn to it (none: neither)."""
    stop_when: Sequence[StopCondition] | None = None
    """Replaces the agent's stopWhen for this call."""
    abort_signal: asyncio.Event | None = None
    """Set it to abort the run: in-flight calls are cancelled, the result keeps what was done."""
    run_id: str | None = None
    """The run's id, chosen by the caller (None: a new UUID); the APIs check it is not in use."""
    on_abort: Callable[[dict[str, Any]], Awaitable[None] | None] | None = None
    """Called (or awaited) once when the abort signal stops the run, with ``steps`` (those done)
    and ``text`` (the interrupted step's text so far), before processOutputResult; an exception
    in it is logged and swallowed."""
    require_tool_approval: bool | None = None
    """True: every tool call waits for approval; False: none does; None: each tool's setting."""
    announce_violations: bool = False
    """Also stream each violation as a transient ``data-procmesh-violation`` chunk when it is
    recorded (the HTTP and gRPC APIs turn it on: remote callers have no `on_violation`)."""
    client_tools: Sequence[ClientTool] = ()
    """Tools the caller runs: the run ends at their call (finish reason ``tool-calls``)."""
    trace_parent: Mapping[str, str] | None = None
    """The caller's W3C trace context (``traceparent``, ``tracestate``): the run's span continues it."""
    instructions: str | None = None
    """Replaces the agent's instructions (its system message) for this call ("": none)."""
    system: Sequence[str] = ()
    """System messages added after the instructions for this call."""
    model_settings: Mapping[str, Any] | None = None
    """The model call's settings (``temperature``, ``maxOutputTokens``, ``topP``, ...) for every
    step; a processor's processInputStep still sees and may change them."""
    tool_choice: Any = None
    """``auto``, ``none``, ``required`` or ``{"type": "tool", "toolName"}`` for every step (None:
    ``auto`` when tools are offered)."""
    active_tools: Sequence[str] | None = None
    """The names of the offered tools the model may call (None: all)."""
    structured_output: StructuredOutput | None = None
    """Answer with a JSON value matching a schema: the result's `RunResult.object`."""
    memory: MemoryCallOptions = field(default_factory=MemoryCallOptions)
    """This call's memory options (window, read-only, recall); each None field: the agent's."""
    prepare_step: PrepareStepFunction | None = None
    """The reference's prepareStep: called before each model step with a `StepContext`, after the
    input lane's processInputStep; the `StepOverride` it returns lasts that step. Not kept in a
    snapshot: a resumed run uses the resuming call's."""
    prepare_steps: Sequence[StepRule] = ()
    """prepareStep as data (the HTTP body's ``prepareSteps``): each rule's override at its step(s),
    applied before `prepare_step`; kept in a snapshot."""


@dataclass(frozen=True)
class StructuredOutput:
    """A call's structured output: the JSON schema the answer follows, and what a mismatch does."""

    schema: Mapping[str, Any]
    error_strategy: str = "strict"
    """``strict``: the run fails; ``warn``: logged, no object; ``fallback``: `fallback_value`."""
    fallback_value: Any = None
    instructions: str | None = None
    """Replaces the default instruction that asks the model for the JSON value (with `model`: the
    structuring model's instructions)."""
    model: str | None = None
    """A second model that turns the agent's answer into the schema (the agent's model then
    answers freely); None: the agent's model answers in JSON itself."""
    json_prompt_injection: bool = False
    """The reference's ``jsonPromptInjection``: the schema goes to the model only in the prompt (the
    `structured.instruction` system message, or the structuring model's instructions), with no
    native response format, for a provider whose JSON-schema mode is missing or broken."""


@dataclass
class RunResult:
    """What a run produced (the `generate()` result; a stream resolves to it)."""

    run_id: str
    text: str
    finish_reason: str
    steps: list[dict[str, Any]]
    tripwire: dict[str, Any] | None
    usage: dict[str, int]
    response_messages: list[dict[str, Any]]
    violations: list[dict[str, Any]]
    error: str | None = None
    status: str = "success"
    """``success``, ``failed``, ``tripwire``, ``aborted`` (the caller's abort signal: what was done
    is kept) or ``suspended`` (a tool call awaits approval: see `suspended`)."""
    suspended: list[dict[str, Any]] = field(default_factory=list)
    """The tool calls awaiting a decision (``toolCallId``, ``toolName``, ``args``); approve or
    decline one with `Agent.approve_tool_call` / `decline_tool_call` and this `run_id`."""
    trace_id: str | None = None
    """The run's trace id (hex) when tracing is on."""
    object: Any = None
    """The parsed, validated answer of a call with `CallOptions.structured_output`."""
    model_id: str | None = None
    """The model that answered the run's last model call (a fallback when the first ones failed)."""
    used_fallback_value: bool = False
    """`object` is the structured output's ``fallbackValue``: the answer did not match its schema."""

    @property
    def assistant_metadata(self) -> dict[str, Any]:
        """Metadata processors attached to the response's assistant messages (merged)."""
        return assistant_metadata(self.response_messages)


def assistant_metadata(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Metadata processors attached to assistant messages (merged; ``__``-keys are internal)."""
    merged: dict[str, Any] = {}
    for msg in messages:
        if msg.get("role") == "assistant":
            meta = (msg.get("content") or {}).get("metadata") or {}
            merged.update({k: v for k, v in meta.items() if not k.startswith("__")})
    return merged
