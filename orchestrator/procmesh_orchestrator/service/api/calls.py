"""A call as both APIs take it, validated once into an `AgentCall`.

The HTTP API takes the reference server's JSON body (``messages`` plus call options, `parse_body`)
and the gRPC API its proto twin (`service.grpc.requests.parse_proto`, which validates its option
fields with the same `call_options.StepOptions`); both end up as one `AgentCall`, so validation
and the trust rule for request context exist once. The body's ``memory`` is `call_memory`'s; an
approve / decline request is `resume`'s `ResumeRequest`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ConfigDict, Field, field_validator

from procmesh_orchestrator.run import CallOptions, stop
from procmesh_orchestrator.run.context import ContextSchema
from procmesh_orchestrator.run.framework.memory import MemoryCallOptions
from procmesh_orchestrator.run.framework.prepare_step import StepOverride, StepRule
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service._limits import InputLimits, check_input, check_message_count
from procmesh_orchestrator.service._trust import ContextTrust
from procmesh_orchestrator.service.api.call_memory import MemoryBody, memory_scope
from procmesh_orchestrator.service.api.call_options import (
    StepOptions,
    check_stream_format,
    client_tool_extras,
    client_tools,
    lane_ids,
    step_kwargs,
    validated,
)
from procmesh_orchestrator.service.api.context_cases import NOT_A_STRING
from procmesh_orchestrator.service.api.message_keys import Keys, ignored_labels
from procmesh_orchestrator.service.api.messages import input_message, own_ids
from procmesh_orchestrator.service.api.step_settings import (
    IGNORED_CLIENT_TOOL_KEYS,
    IGNORED_OPTIONS,
    IGNORED_SETTINGS,
)


@dataclass
class AgentCall:
    """A validated agent call: input as `Agent.generate` takes it, and its options."""

    input: str | list[dict[str, Any]]
    options: CallOptions
    durable: bool = False
    """The caller asked for a durable run (an agent configured ``durable: true`` always is one)."""
    lanes: dict[str, list[str]] = field(default_factory=dict)
    """Per-call processor lists by lane (``input``, ``output``, ``error``): the ids the caller named,
    bound by `api.processors.bind_lanes` (`call_lanes.bind`, which needs the App)."""
    dropped_context: list[str] = field(default_factory=list)
    """Request-context keys the caller is not trusted for or the agent does not declare, dropped
    (PROCMESH_UNTRUSTED_CONTEXT=drop): the response names them."""
    ignored_settings: list[str] = field(default_factory=list)
    """The ``modelSettings`` keys given that procmesh does not apply (`IGNORED_SETTINGS`)."""
    ignored_options: list[str] = field(default_factory=list)
    """The body's keys procmesh does not apply (`IGNORED_OPTIONS`, or ones neither side knows)."""
    ignored_message_keys: list[tuple[str, str]] = field(default_factory=list)
    """The input messages' keys procmesh takes but does not apply, each once: its label
    (``textPart.providerOptions``) and why (`message_keys`)."""

    @property
    def warnings(self) -> list[dict[str, Any]]:
        """The call's warnings, in the reference's shape (the result's ``warnings``)."""
        named = [
            *((name, IGNORED_SETTINGS[name]) for name in self.ignored_settings),
            *((name, _ignored(name)[1]) for name in self.ignored_options),
            *((f"messages.{name}", why) for name, why in self.ignored_message_keys),
        ]
        return [{"type": "unsupported-setting", "setting": name, "details": why} for name, why in named]

    @property
    def ignored_labels(self) -> list[str]:
        """What `ignored_settings` and `ignored_options` count under (a key neither side knows:
        ``other``, so that a caller's keys never become metric labels)."""
        return [*self.ignored_settings, *(_ignored(name)[0] for name in self.ignored_options)]

    def drop_undeclared(self, trust: ContextTrust, schema: ContextSchema | None) -> AgentCall:
        """In drop mode, the call without the request-context keys `schema` (the agent's
        requestContextSchema) does not declare, noted in `dropped_context`; otherwise as it is
        (the schema's check refuses them)."""
        context = self.options.request_context
        undeclared = schema.undeclared(context) if trust.drop and schema is not None else []
        if undeclared:
            kept = {k: v for k, v in context.items() if k not in undeclared}
            self.options = replace(self.options, request_context=kept)
            self.dropped_context = sorted({*self.dropped_context, *undeclared})
        return self

    def note_memoryless(self, has_memory: bool, has_recall: bool = False) -> None:
        """For an agent without memory, the thread and memory options the call gives noted in
        `ignored_options` (its warnings, the log line and the counter): the run goes on, as the
        reference's does, but the caller learns that nothing of the turn is kept. For an agent
        with memory but no semantic recall, a call's ``semanticRecall: true`` the same way
        (``memory.options.semanticRecall``): the reference merges it over the memory's config and
        recalls with the memory's vector store and embedder; procmesh's come with the agent's
        ``semanticRecall`` config, so without it there is nothing to recall with."""
        if has_memory:
            if self.options.memory.semantic_recall and not has_recall:
                self.ignored_options = [*self.ignored_options, "memory.options.semanticRecall"]
            return
        given = [
            *(["memory.thread"] if self.options.thread_id else []),
            *(["memory.options"] if self.options.memory != MemoryCallOptions() else []),
        ]
        self.ignored_options = [*self.ignored_options, *given]

    def note_uncased(self, keys: list[str]) -> None:
        """Request-context keys whose value, not a string, chose no case (`context_cases`), noted
        in `ignored_options` as ``requestContext.KEY``: the run goes on with the default."""
        self.ignored_options = [*self.ignored_options, *(f"requestContext.{k}" for k in keys)]

    def traced(self, headers: Mapping[str, str]) -> AgentCall:
        """The call continuing the caller's W3C trace context (HTTP headers or gRPC metadata)."""
        found = {k: headers[k] for k in ("traceparent", "tracestate") if headers.get(k)}
        if found:
            self.options = replace(self.options, trace_parent=found)
        return self


RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
"""A caller's run id: letters, digits and ``._:-``, at most 128 characters (it names the run in
logs, the store, SSE headers and URLs)."""


def _ignored(name: str) -> tuple[str, str]:
    """An ignored option's counter label and why it is ignored: a body key (`IGNORED_OPTIONS`) or a
    client tool's (``clientTools.NAME.KEY``: `IGNORED_CLIENT_TOOL_KEYS`, labelled without NAME)."""
    unknown = "neither procmesh nor the reference server takes this option"
    if name.startswith("requestContext."):  # labelled without the key: a caller's keys are no labels
        return "requestContext", NOT_A_STRING
    if name.startswith("clientTools."):
        key = name.rsplit(".", 1)[1]
        if key in IGNORED_CLIENT_TOOL_KEYS:
            return f"clientTools.{key}", IGNORED_CLIENT_TOOL_KEYS[key]
        return "other", unknown
    return (name, IGNORED_OPTIONS[name]) if name in IGNORED_OPTIONS else ("other", unknown)


class _Body(StepOptions):
    """The reference server's body for /generate and /stream; a key it does not take is kept aside
    (``model_extra``) for the call's warnings (`IGNORED_OPTIONS`)."""

    model_config = ConfigDict(extra="allow")

    messages: str | list[str | dict[str, Any]]
    max_steps: int | None = Field(default=None, ge=1, alias="maxSteps")
    max_processor_retries: int | None = Field(default=None, ge=0, alias="maxProcessorRetries")
    request_context: dict[str, Any] | None = Field(default=None, alias="requestContext")
    runtime_context: dict[str, Any] | None = Field(default=None, alias="runtimeContext")
    resource_id: str | None = Field(default=None, alias="resourceId")
    thread_id: str | None = Field(default=None, alias="threadId")
    memory: MemoryBody | None = None
    """``{thread, resource}`` as @mastra/client-js sends it (``threadId``/``resourceId`` the same
    values, if given too: `_one_of`)."""
    client_tools: dict[str, Any] | None = Field(default=None, alias="clientTools")
    """Tools the caller runs: name -> ``{id?, description, inputSchema | parameters}``."""
    require_tool_approval: bool | None = Field(default=None, alias="requireToolApproval")
    stop_when: Any = Field(default=None, alias="stopWhen")
    """``[{stepCountIs: n}, {hasToolCall: name}]`` (one object is one condition)."""
    durable: bool = Field(default=False, strict=True)
    """Run durably: checkpointed, taken over by another replica, reattachable (``observe``)."""
    run_id: str | None = Field(default=None, alias="runId", max_length=128, pattern=RUN_ID_PATTERN)
    """The run's id, the caller's choice (a new UUID when absent): in use by another run: 409."""
    model: str | None = Field(default=None, min_length=1)
    """Every step's model (a key of the agent's ``models``), before ``prepareSteps``."""
    provider_options: dict[str, dict[str, Any]] | None = Field(default=None, alias="providerOptions")
    """Every step's provider options, before ``prepareSteps``."""
    format: Any = None
    """The reference's stream format: ``"mastra"`` (what procmesh streams) or a 400
    (`check_stream_format`)."""

    def call_rule(self) -> tuple[StepRule, ...]:
        """``model`` and ``providerOptions`` as a rule from step 0, so ``prepareSteps`` (later
        rules) override them per step, as the reference's prepareStep does the call's."""
        if self.model is None and self.provider_options is None:
            return ()
        return (StepRule(StepOverride(model=self.model, provider_options=self.provider_options), None, 0),)

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, list) and not value:
            raise ValueError("must hold at least one message")
        return value


def parse_body(data: Any, *, caller: Caller, trust: ContextTrust, limits: InputLimits) -> AgentCall:
    """Validate a decoded JSON body from `caller`: its request context as `trust` allows (a 400
    naming the keys it may not send), its thread and resource as `memory_scope`."""
    if not isinstance(data, dict):
        raise BadRequestError("the body must be a JSON object with a 'messages' field")
    if isinstance(data.get("messages"), list):
        check_message_count(len(data["messages"]), limits)
    check_input(data, limits)
    if "prepareStep" in data:  # a function in the reference: what arrives as JSON cannot be it
        raise BadRequestError(
            "prepareStep is a function and cannot cross HTTP: give prepareSteps, its declarative form "
            "([{when: {stepNumber | fromStepNumber}, override: {model, toolChoice, activeTools, system, "
            "providerOptions, modelSettings}}]), or an inputProcessors lane with a processInputStep processor"
        )
    if "output" in data:  # the reference's deprecated form of structuredOutput: no object otherwise
        raise BadRequestError("output: give the schema as structuredOutput: {schema}")
    body = validated(_Body, data)
    check_stream_format(body.format)
    ignored: list[tuple[Keys, str]] = []
    if isinstance(body.messages, str):
        agent_input: str | list[dict[str, Any]] = body.messages
    else:
        agent_input = [input_message(m, f"messages.{i}", ignored) for i, m in enumerate(body.messages)]
        own_ids(agent_input, caller)
    memory = body.memory or MemoryBody()
    # each pair is one value under two names: the first wins only when the other is absent or the
    # same, never by dropping a different value the caller also gave
    _one_of("requestContext", body.request_context, "runtimeContext", body.runtime_context)
    _one_of("threadId", body.thread_id, "memory.thread", memory.thread_id)
    _one_of("resourceId", body.resource_id, "memory.resource", memory.resource)
    named = "requestContext" if body.request_context else "runtimeContext"
    context, dropped = trust.admit(caller, body.request_context or body.runtime_context or {}, named)
    thread, resource = memory_scope(
        body.thread_id or memory.thread_id, body.resource_id or memory.resource, caller=caller
    )
    try:
        stop_when = stop.parse(body.stop_when) if body.stop_when is not None else None
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None
    kwargs = step_kwargs(body)
    kwargs["prepare_steps"] = (*body.call_rule(), *kwargs["prepare_steps"])
    return AgentCall(
        agent_input,
        CallOptions(
            max_steps=body.max_steps,
            max_processor_retries=body.max_processor_retries,
            request_context=context,
            resource_id=resource,
            thread_id=thread,
            run_id=body.run_id,
            stop_when=stop_when,
            require_tool_approval=body.require_tool_approval,
            client_tools=client_tools(body.client_tools or {}),
            memory=memory.call_options(),
            announce_violations=True,  # a remote caller has no onViolation: its stream tells it
            **kwargs,
        ),
        durable=body.durable,
        lanes=lane_ids(body),
        dropped_context=dropped,
        ignored_settings=body.model_settings.ignored() if body.model_settings else [],
        ignored_options=[
            *sorted(body.model_extra or {}),
            *memory.ignored(),
            *client_tool_extras(body.client_tools or {}),
            *(body.structured_output.ignored() if body.structured_output else []),
        ],
        ignored_message_keys=ignored_labels(ignored),
    )


def _one_of(name: str, value: Any, other: str, other_value: Any) -> None:
    """A 400 when a body gives one value under both of its names, differently."""
    if value and other_value and value != other_value:
        raise BadRequestError(f"{name} and {other} differ: give one of them (they name the same thing)")
