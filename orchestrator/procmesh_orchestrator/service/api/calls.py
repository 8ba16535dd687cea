"""A call as both APIs take it: the request shapes, validated once into an `AgentCall`.

The HTTP API takes the reference server's JSON body (``messages`` plus call options, `parse_body`)
and the gRPC API its proto twin (`service.grpc.requests.parse_proto`, which validates its option
fields with the same `StepOptions`); both end up as one `AgentCall`, so validation and the trust
rule for request context exist once. An approve / decline request is a `ResumeRequest`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from procmesh_orchestrator.config.history import MessageHistoryConfig
from procmesh_orchestrator.run import CallOptions, stop
from procmesh_orchestrator.run.context import ContextSchema
from procmesh_orchestrator.run.framework.memory import MemoryCallOptions
from procmesh_orchestrator.run.framework.prepare_step import StepOverride, StepRule
from procmesh_orchestrator.run.hooks import Resumed
from procmesh_orchestrator.run.tools import ClientTool
from procmesh_orchestrator.run.types import StructuredOutput
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError, NotSupportedError
from procmesh_orchestrator.service._limits import InputLimits, check_input, check_message_count
from procmesh_orchestrator.service._trust import ContextTrust
from procmesh_orchestrator.service.api.messages import input_message, own_ids
from procmesh_orchestrator.service.api.step_settings import (
    IGNORED_OPTIONS,
    IGNORED_SETTINGS,
    ModelSettingsBody,
    PrepareStepBody,
    ToolChoice,
    step_rules,
    system_texts,
    tool_choice,
)
from procmesh_orchestrator.store import MAX_ID_CHARS


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

    @property
    def warnings(self) -> list[dict[str, Any]]:
        """The call's warnings, in the reference's shape (the result's ``warnings``)."""
        unknown = "neither procmesh nor the reference server takes this option"
        return [
            {"type": "unsupported-setting", "setting": name, "details": IGNORED_SETTINGS[name]}
            for name in self.ignored_settings
        ] + [
            {"type": "unsupported-setting", "setting": name, "details": IGNORED_OPTIONS.get(name, unknown)}
            for name in self.ignored_options
        ]

    @property
    def ignored_labels(self) -> list[str]:
        """What `ignored_settings` and `ignored_options` count under (a key neither side knows:
        ``other``, so that a caller's keys never become metric labels)."""
        options = [name if name in IGNORED_OPTIONS else "other" for name in self.ignored_options]
        return [*self.ignored_settings, *options]

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

    def traced(self, headers: Mapping[str, str]) -> AgentCall:
        """The call continuing the caller's W3C trace context (HTTP headers or gRPC metadata)."""
        found = {k: headers[k] for k in ("traceparent", "tracestate") if headers.get(k)}
        if found:
            self.options = replace(self.options, trace_parent=found)
        return self


class _ThreadRef(BaseModel):
    """``memory.thread`` as ``{id, ...}``: the reference's other keys (``title``, ``metadata``) are
    kept aside for the call's warnings (`IGNORED_OPTIONS`)."""

    model_config = ConfigDict(extra="allow")

    id: str


class _MemoryOptions(BaseModel):
    """``memory.options``: the reference's per-call memory config, the keys procmesh takes (any
    other is refused by name)."""

    model_config = ConfigDict(extra="forbid")

    last_messages: StrictInt | Literal[False] | None = Field(default=None, alias="lastMessages", ge=0)
    read_only: bool | None = Field(default=None, alias="readOnly")
    semantic_recall: bool | None = Field(default=None, alias="semanticRecall")
    message_history: MessageHistoryConfig | None = Field(default=None, alias="messageHistory")

    def options(self) -> MemoryCallOptions:
        window = 0 if self.last_messages is False else self.last_messages
        budget = None if self.message_history is None else self.message_history.budget()
        return MemoryCallOptions(window, self.read_only, self.semantic_recall, budget)


class _MemoryBody(BaseModel):
    """The body's ``memory``: the thread as its id or ``{id, ...}``, the resource, the options, and
    ``readOnly`` (the reference's shorthand for ``options.readOnly``, which wins when both are given);
    any other key is refused by name."""

    model_config = ConfigDict(extra="forbid")

    thread: str | _ThreadRef | None = None
    resource: str | None = None
    options: _MemoryOptions | None = None
    read_only: bool | None = Field(default=None, alias="readOnly")

    def ignored(self) -> list[str]:
        """The thread object's keys procmesh does not apply, by their body path."""
        thread = self.thread if isinstance(self.thread, _ThreadRef) else None
        return [f"memory.thread.{key}" for key in sorted(thread.model_extra or {})] if thread else []

    def call_options(self) -> MemoryCallOptions:
        options = self.options.options() if self.options else MemoryCallOptions()
        if options.read_only is None and self.read_only is not None:
            return replace(options, read_only=self.read_only)
        return options

    @property
    def thread_id(self) -> str | None:
        return self.thread.id if isinstance(self.thread, _ThreadRef) else self.thread


class _StructuredOutputBody(BaseModel):
    """``structuredOutput``: a JSON schema, what a mismatch does, an optional structuring model, and
    the keys the reference server takes; any other (``providerOptions``, ``useAgent``: options
    the reference's server does not take either) is refused by name."""

    model_config = ConfigDict(extra="forbid")

    schema_: dict[str, Any] = Field(alias="schema")
    error_strategy: Literal["strict", "warn", "fallback"] = Field(default="strict", alias="errorStrategy")
    fallback_value: Any = Field(default=None, alias="fallbackValue")
    instructions: str | None = None
    model: Any = None
    json_prompt_injection: StrictBool = Field(default=False, alias="jsonPromptInjection")


class StepOptions(BaseModel):
    """The options both APIs take by the reference's names: the HTTP body's keys, and the gRPC
    request's option fields as JSON (`_proto_options`), so they are validated and turned into
    `CallOptions` in one place (`step_kwargs`, `lane_ids`)."""

    model_config = ConfigDict(extra="ignore")

    instructions: Any = None
    """Replaces the agent's instructions: a string, a list of strings or system messages."""
    system: Any = None
    """System messages added after the instructions (the same forms)."""
    model_settings: ModelSettingsBody | None = Field(default=None, alias="modelSettings")
    tool_choice: ToolChoice | None = Field(default=None, alias="toolChoice")
    active_tools: list[str] | None = Field(default=None, alias="activeTools")
    structured_output: _StructuredOutputBody | None = Field(default=None, alias="structuredOutput")
    input_processors: list[Any] | None = Field(default=None, alias="inputProcessors")
    """Replaces the agent's lanes for this call: processor ids (`Lanes`)."""
    output_processors: list[Any] | None = Field(default=None, alias="outputProcessors")
    error_processors: list[Any] | None = Field(default=None, alias="errorProcessors")
    prepare_steps: list[PrepareStepBody] | None = Field(default=None, alias="prepareSteps")
    """The reference's prepareStep as data (`step_settings.step_rules`)."""


RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
"""A caller's run id: letters, digits and ``._:-``, at most 128 characters (it names the run in
logs, the store, SSE headers and URLs)."""


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
    memory: _MemoryBody | None = None
    """``{thread, resource}`` as @mastra/client-js sends it (``threadId``/``resourceId`` win)."""
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


def client_tools(tools: dict[str, Any], field: str = "clientTools") -> list[ClientTool]:
    """``clientTools`` as ClientTools; a 400 naming the tool when one is malformed."""
    out: list[ClientTool] = []
    for name, tool in tools.items():
        where = f"{field}.{name}"
        if not name or len(name) > 128 or not name.isprintable():
            raise BadRequestError(f"{field}: {name[:64]!r} is not a tool name (1-128 printable characters)")
        if not isinstance(tool, dict):
            raise BadRequestError(f"{where}: must be an object {{description, inputSchema}}")
        description = tool.get("description", "")
        if not isinstance(description, str):
            raise BadRequestError(f"{where}.description: must be a string")
        key = "inputSchema" if tool.get("inputSchema") is not None else "parameters"
        schema = tool.get(key)
        if schema is None:
            schema = {"type": "object"}
        if not isinstance(schema, dict):
            raise BadRequestError(f"{where}.{key}: must be a JSON schema object")
        try:
            jsonschema.validators.validator_for(schema).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise BadRequestError(f"{where}.{key}: not a valid JSON schema: {exc.message}") from None
        out.append(ClientTool(name, description, schema))
    return out


def memory_scope(thread: str | None, resource: str | None, *, caller: Caller) -> tuple[str, str]:
    """The (thread, resource) a call runs with; memory loads and saves only with both.

    The resource scopes per-user data (memory threads, response-cache entries), so it is the
    caller's API key's: a key bound to a resource runs as that one (claiming another is refused);
    an operator key (or any caller when no key is configured) names the resource it acts for, or
    none. The thread is the caller's to name, within that resource: the store scopes threads by
    resource, so no caller reads another's history. A thread without a resource is refused (a
    400 naming resourceId): the run could neither load nor save it, and doing it silently would
    lose the turn.
    """
    for name, value in (("threadId", thread), ("resourceId", resource)):
        # refused here, as a 400, rather than by the store once the run has started
        if value and (len(value) > MAX_ID_CHARS or not value.isprintable()):
            raise BadRequestError(f"{name}: must be a printable id of at most {MAX_ID_CHARS} characters")
    if caller.resource is not None:
        if resource and resource != caller.resource:
            raise BadRequestError("resourceId: this API key is bound to another resource")
        resource = caller.resource
    elif not caller.operator:
        resource = None
    if not resource:
        if thread:
            raise BadRequestError(
                "threadId: a thread belongs to a resource (a user, an org); name it with resourceId, "
                "or call with an API key bound to one (PROCMESH_API_KEYS key=resource)"
            )
        return "", ""
    return thread or "", resource


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
    if isinstance(body.messages, str):
        agent_input: str | list[dict[str, Any]] = body.messages
    else:
        agent_input = [input_message(m, f"messages.{i}") for i, m in enumerate(body.messages)]
        own_ids(agent_input, caller)
    named = "requestContext" if body.request_context else "runtimeContext"
    context, dropped = trust.admit(caller, body.request_context or body.runtime_context or {}, named)
    memory = body.memory or _MemoryBody()
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
        ignored_options=sorted(body.model_extra or {}) + memory.ignored(),
    )


_M = TypeVar("_M", bound=BaseModel)


def validated(model: type[_M], data: Any) -> _M:
    """`data` as `model`; a 400 naming every problem by its field (the reference's names)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors()
        )
        raise BadRequestError(problems) from None


def step_kwargs(body: StepOptions) -> dict[str, Any]:
    """The `CallOptions` fields of the options both APIs share."""
    instructions = system_texts(body.instructions, "instructions")
    return {
        "instructions": None if instructions is None else "\n\n".join(instructions),
        "system": system_texts(body.system, "system") or (),
        "model_settings": body.model_settings.wire() if body.model_settings else None,
        "tool_choice": tool_choice(body.tool_choice),
        "active_tools": body.active_tools,
        "structured_output": _structured_output(body.structured_output),
        "prepare_steps": step_rules(body.prepare_steps),
    }


LANES = ("input", "output", "error")
_MAX_PROCESSOR_ID = 256


def lane_ids(body: StepOptions) -> dict[str, list[str]]:
    """The per-call processor lists as ids, by lane; a lane not given is absent (the agent's)."""
    out: dict[str, list[str]] = {}
    for kind in LANES:
        entries = getattr(body, f"{kind}_processors")
        if entries is not None:
            out[kind] = [_processor_id(e, f"{kind}Processors.{i}") for i, e in enumerate(entries)]
    return out


def _processor_id(entry: Any, where: str) -> str:
    """A lane entry as the id it names: a string, or what @mastra/client-js sends for a processor
    object (JSON drops its functions: ``{id, name?, ...}``, of which the id counts)."""
    value = entry.get("id") if isinstance(entry, dict) else entry
    if isinstance(entry, dict) and value is None:
        raise NotSupportedError(
            f"{where}: processors defined in the caller's code are not supported by procmesh: "
            "their code cannot travel; name a processor the orchestrator's sidecars host by its id"
        )
    if not isinstance(value, str) or not value or len(value) > _MAX_PROCESSOR_ID or not value.isprintable():
        raise BadRequestError(f"{where}: must be a processor id (a string) or an object with an 'id'")
    return value


def _structured_output(body: _StructuredOutputBody | None) -> StructuredOutput | None:
    if body is None:
        return None
    if body.model is not None and not (isinstance(body.model, str) and body.model):
        raise BadRequestError(
            "structuredOutput.model: give the structuring model as a reference, a `models` key or "
            "'provider/model-id' (or leave it out: the agent's model answers in JSON)"
        )
    try:
        jsonschema.validators.validator_for(body.schema_).check_schema(body.schema_)
    except jsonschema.SchemaError as exc:
        raise BadRequestError(f"structuredOutput.schema: not a valid JSON schema: {exc.message}") from None
    return StructuredOutput(
        body.schema_,
        body.error_strategy,
        body.fallback_value,
        body.instructions,
        body.model,
        body.json_prompt_injection,
    )


@dataclass
class ResumeRequest:
    """A validated approve / decline request: which run, which call, and why (a decline); or a
    resume-stream request, with the data a suspended tool asked for (`data`)."""

    run_id: str
    tool_call_id: str | None
    """None (resume-stream only): the run's only awaited call."""
    reason: str | None
    request_context: dict[str, Any]
    data: Resumed | None = None
    """resume-stream's ``resumeData`` (the tool sees it); None for approve / decline."""


class _ResumeBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    run_id: str = Field(alias="runId", min_length=1, max_length=MAX_ID_CHARS)
    tool_call_id: str = Field(alias="toolCallId", min_length=1, max_length=MAX_ID_CHARS)
    reason: str | None = Field(default=None, max_length=4096)
    request_context: dict[str, Any] | None = Field(default=None, alias="requestContext")


class _ResumeDataBody(BaseModel):
    model_config = ConfigDict(extra="forbid")  # the snapshot decides the rest: an option is an error

    run_id: str = Field(alias="runId", min_length=1, max_length=MAX_ID_CHARS)
    tool_call_id: str | None = Field(default=None, alias="toolCallId", min_length=1, max_length=MAX_ID_CHARS)
    resume_data: Any = Field(alias="resumeData")
    request_context: dict[str, Any] | None = Field(default=None, alias="requestContext")


def parse_resume_data(
    data: Any, *, caller: Caller, trust: ContextTrust, limits: InputLimits
) -> ResumeRequest:
    """The body of resume-stream (`@mastra/client-js` ``resumeStream(resumeData, {runId,
    toolCallId?})``: without ``toolCallId``, the run's only awaited call); its request context as
    `trust` allows `caller`. ``resumeData`` is required (null included); any other key is refused
    by name."""
    if not isinstance(data, dict):
        raise BadRequestError("the body must be a JSON object with 'runId', 'resumeData' and 'toolCallId'?")
    check_input(data, limits)
    body = validated(_ResumeDataBody, data)
    context = trust.check(caller, body.request_context or {})
    return ResumeRequest(body.run_id, body.tool_call_id, None, context, Resumed(body.resume_data, None))


def parse_resume(data: Any, *, caller: Caller, trust: ContextTrust, limits: InputLimits) -> ResumeRequest:
    """The body of approve-tool-call / decline-tool-call (and the -generate routes); its request
    context as `trust` allows `caller`."""
    if not isinstance(data, dict):
        raise BadRequestError("the body must be a JSON object with 'runId' and 'toolCallId'")
    check_input(data, limits)
    body = validated(_ResumeBody, data)
    context = trust.check(caller, body.request_context or {})
    return ResumeRequest(body.run_id, body.tool_call_id, body.reason, context)


class ResumeParser(Protocol):
    """`parse_resume` or `parse_resume_data`: a resume route's body as a `ResumeRequest`."""

    def __call__(
        self, data: Any, *, caller: Caller, trust: ContextTrust, limits: InputLimits
    ) -> ResumeRequest: ...
