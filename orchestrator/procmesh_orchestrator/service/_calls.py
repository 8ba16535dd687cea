"""What both APIs share: request validation, result and chunk shapes, errors, the run gate.

The HTTP API takes the reference server's JSON body (``messages`` plus call options) and
the gRPC API its proto twin; both end up here as one `AgentCall`, so validation and
the trust rule for request context exist once.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

import jsonschema
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from procmesh import convert
from procmesh_orchestrator.memory._common import MAX_ID_CHARS
from procmesh_orchestrator.run import CallOptions, RunResult, stop
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run.tools import ClientTool
from procmesh_orchestrator.run.types import StructuredOutput
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import (
    BadRequestError,
    DrainingError,
    NotSupportedError,
)
from procmesh_orchestrator.service._limits import InputLimits, check_input, check_message_count
from procmesh_orchestrator.service._trust import ContextTrust

Chunk = dict[str, Any]


# -- the call -------------------------------------------------------------------------------


@dataclass
class AgentCall:
    """A validated agent call: input as `Agent.generate` takes it, and its options."""

    input: str | list[dict[str, Any]]
    options: CallOptions
    durable: bool = False
    """The caller asked for a durable run (an agent configured ``durable: true`` always is one)."""
    lanes: dict[str, list[str]] = field(default_factory=dict)
    """Per-call processor lists by lane (``input``, ``output``, ``error``): the ids the caller named,
    bound by `_processors_api.bind_lanes` (`call_lanes.bind`, which needs the App)."""

    def traced(self, headers: Mapping[str, str]) -> AgentCall:
        """The call continuing the caller's W3C trace context (HTTP headers or gRPC metadata)."""
        found = {k: headers[k] for k in ("traceparent", "tracestate") if headers.get(k)}
        if found:
            self.options = replace(self.options, trace_parent=found)
        return self


class _ThreadRef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str


class _MemoryBody(BaseModel):
    """The body's ``memory``: the thread as its id or ``{id, ...}``, and the resource."""

    model_config = ConfigDict(extra="ignore")

    thread: str | _ThreadRef | None = None
    resource: str | None = None

    @property
    def thread_id(self) -> str | None:
        return self.thread.id if isinstance(self.thread, _ThreadRef) else self.thread


class _ModelSettings(BaseModel):
    """``modelSettings``: what the providers send (an unknown key is refused, never ignored)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0)
    max_output_tokens: int | None = Field(default=None, ge=1, alias="maxOutputTokens")
    top_p: float | None = Field(default=None, ge=0, le=1, alias="topP")
    top_k: int | None = Field(default=None, ge=1, alias="topK")
    presence_penalty: float | None = Field(default=None, alias="presencePenalty")
    frequency_penalty: float | None = Field(default=None, alias="frequencyPenalty")
    stop_sequences: list[str] | None = Field(default=None, alias="stopSequences")
    seed: int | None = None

    def wire(self) -> dict[str, Any]:
        """The settings given, by their camelCase names (what `StepConfig.model_settings` holds)."""
        return self.model_dump(by_alias=True, exclude_none=True)


class _ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["tool"]
    tool_name: str = Field(alias="toolName", min_length=1)


class _StructuredOutputBody(BaseModel):
    """``structuredOutput``: a JSON schema, what a mismatch does, and an optional structuring model."""

    model_config = ConfigDict(extra="ignore")

    schema_: dict[str, Any] = Field(alias="schema")
    error_strategy: Literal["strict", "warn", "fallback"] = Field(default="strict", alias="errorStrategy")
    fallback_value: Any = Field(default=None, alias="fallbackValue")
    instructions: str | None = None
    model: Any = None
    json_prompt_injection: bool | None = Field(default=None, alias="jsonPromptInjection")


class _StepOptions(BaseModel):
    """The options both APIs take by the reference's names: the HTTP body's keys, and the gRPC
    request's option fields as JSON (`_proto_options`), so they are validated and turned into
    `CallOptions` in one place (`_step_kwargs`, `_lane_ids`)."""

    model_config = ConfigDict(extra="ignore")

    instructions: Any = None
    """Replaces the agent's instructions: a string, a list of strings or system messages."""
    system: Any = None
    """System messages added after the instructions (the same forms)."""
    model_settings: _ModelSettings | None = Field(default=None, alias="modelSettings")
    tool_choice: Literal["auto", "none", "required"] | _ToolChoice | None = Field(
        default=None, alias="toolChoice"
    )
    active_tools: list[str] | None = Field(default=None, alias="activeTools")
    structured_output: _StructuredOutputBody | None = Field(default=None, alias="structuredOutput")
    input_processors: list[Any] | None = Field(default=None, alias="inputProcessors")
    """Replaces the agent's lanes for this call: processor ids (`Lanes`)."""
    output_processors: list[Any] | None = Field(default=None, alias="outputProcessors")
    error_processors: list[Any] | None = Field(default=None, alias="errorProcessors")


class _Body(_StepOptions):
    """The reference server's body for /generate and /stream (unknown keys are ignored)."""

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

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, list) and not value:
            raise ValueError("must hold at least one message")
        return value


_ROLES = ("user", "assistant", "system")


def _message(item: str | dict[str, Any], where: str) -> dict[str, Any]:
    """One input message as a MastraDBMessage dict; raises BadRequestError naming `where`."""
    if isinstance(item, str):
        return msgs.text_message("user", item)
    role = item.get("role", "user")
    if role not in _ROLES:
        raise BadRequestError(f"{where}.role: must be one of {', '.join(_ROLES)}, got {role!r}")
    content = item.get("content")
    if isinstance(content, str):
        return msgs.text_message(role, content)
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for i, part in enumerate(content):
            at = f"{where}.content.{i}"
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            elif isinstance(part, dict) and part.get("type") in _FILE_PARTS and role == "user":
                parts.append(_file_part(part, at))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                allowed = "text, image, file" if role == "user" else "text parts {type, text}"
                raise BadRequestError(f"{at}: unsupported part {kind!r} ({allowed} only)")
        message = msgs.text_message(role, "")
        message["content"]["parts"] = parts
        return message
    if isinstance(content, dict):  # a MastraDBMessage (format 2)
        message = {**item, "role": role, "id": item.get("id") or msgs.new_id()}
        try:
            convert.message_to_proto(message)
        except (ValueError, TypeError, AttributeError) as exc:
            raise BadRequestError(f"{where}.content: {exc}") from None
        return message
    raise BadRequestError(f"{where}.content: must be a string, a list of text parts or a message content")


_FILE_PARTS = ("image", "file")
_IMAGE_MAGIC = {"/9j/": "image/jpeg", "iVBOR": "image/png", "R0lGOD": "image/gif", "UklGR": "image/webp"}


def _file_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An image or file part (AI SDK model or UI message, either version) as the run's file part
    ``{type: "file", mediaType, data, filename?}``; ``data`` is a URL, a data URL or base64."""
    kind = part["type"]
    keys = ("image", "url", "data") if kind == "image" else ("data", "url")
    data = next((part[k] for k in keys if isinstance(part.get(k), str) and part[k]), None)
    if data is None:
        raise BadRequestError(f"{where}: a {kind} part needs {' or '.join(keys)} (a URL or base64)")
    media = part.get("mediaType") or part.get("mimeType")
    if not media and data.startswith("data:"):
        media = data[5:].partition(";")[0].partition(",")[0]
    if not media and kind == "image":
        if data.startswith(("http://", "https://")):
            media = "image/*"
        else:
            media = next((t for magic, t in _IMAGE_MAGIC.items() if data.startswith(magic)), None)
    if not isinstance(media, str) or not media:
        raise BadRequestError(f"{where}: a {kind} part needs its mediaType (mimeType)")
    out = {"type": "file", "mediaType": media, "data": data}
    if isinstance(part.get("filename"), str) and part["filename"]:
        out["filename"] = part["filename"]
    return out


def _unwrap_output(output: Any) -> Any:
    """An AI SDK tool-result ``output`` (``{type: "json" | "text" | ..., value}``) as its value."""
    if isinstance(output, dict) and isinstance(output.get("type"), str) and "value" in output:
        return output["value"]
    return output


def _tool_result(part: dict[str, Any], where: str) -> dict[str, Any]:
    call_id, name = part.get("toolCallId"), part.get("toolName")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise BadRequestError(f"{where}: a tool-result needs toolCallId and toolName strings")
    result = part["result"] if "result" in part else _unwrap_output(part.get("output"))
    return {"type": "tool-result", "toolCallId": call_id, "toolName": name, "result": result}


def _invocation(call_id: Any, name: Any, args: Any, where: str, **extra: Any) -> dict[str, Any]:
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
        raise BadRequestError(f"{where}: a tool call needs toolCallId and toolName strings")
    return {
        "type": "tool-invocation",
        "toolInvocation": {"state": "call", "toolCallId": call_id, "toolName": name, "args": args, **extra},
    }


def _format2(role: str, parts: list[dict[str, Any]], item: dict[str, Any]) -> dict[str, Any]:
    message = msgs.text_message(role, "")
    message["content"]["parts"] = parts
    if isinstance(item.get("id"), str) and item["id"]:
        message["id"] = item["id"]
    return message


_DROPPED_UI_PARTS = ("step-start", "reasoning", "source")
"""UI parts that carry nothing the run reads back (the reference drops them from the prompt too)."""


def _ui_message(item: dict[str, Any], role: str, where: str) -> dict[str, Any]:
    """A UI message ``{id, role, parts}`` (what the client keeps of a streamed answer)."""
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(item["parts"]):
        at = f"{where}.parts.{i}"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or not isinstance(kind, str):
            raise BadRequestError(f"{at}: must be an object with a type")
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif (
            kind == "tool-invocation" and role == "assistant" and isinstance(part.get("toolInvocation"), dict)
        ):
            inv = part["toolInvocation"]
            state = inv.get("state")
            if state == "call":
                parts.append(_invocation(inv.get("toolCallId"), inv.get("toolName"), inv.get("args"), at))
            elif state == "result" and "result" in inv:
                parts.append(
                    _invocation(
                        inv.get("toolCallId"), inv.get("toolName"), inv.get("args"), at, result=inv["result"]
                    )
                )
                parts[-1]["toolInvocation"]["state"] = "result"
            else:
                raise BadRequestError(
                    f"{at}.toolInvocation.state: must be 'call' or 'result' (with a result)"
                )
        elif kind in _FILE_PARTS and role == "user":
            parts.append(_file_part(part, at))
        elif kind in _DROPPED_UI_PARTS:
            continue
        else:
            raise BadRequestError(f"{at}: unsupported part {kind!r} (text, file, tool-invocation)")
    return _format2(role, parts, item)


def _model_message(item: dict[str, Any], role: str, where: str) -> dict[str, Any]:
    """An AI SDK model message with a list content: text, and for the assistant tool-call parts;
    a ``tool`` message's tool-result parts."""
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(item["content"]):
        at = f"{where}.content.{i}"
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if not isinstance(part, dict):
            raise BadRequestError(f"{at}: unsupported part {kind!r}")
        if role == "tool":
            if kind != "tool-result":
                raise BadRequestError(f"{at}: a tool message holds tool-result parts only, got {kind!r}")
            parts.append(_tool_result(part, at))
        elif kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "tool-call" and role == "assistant":
            args = part["input"] if "input" in part else part.get("args")
            parts.append(_invocation(part.get("toolCallId"), part.get("toolName"), args, at))
        elif kind in _FILE_PARTS and role == "user":
            parts.append(_file_part(part, at))
        elif kind == "reasoning" and role == "assistant":
            continue
        else:
            allowed = "text, tool-call" if role == "assistant" else "text, image, file"
            raise BadRequestError(f"{at}: unsupported part {kind!r} ({allowed} only)")
    return _format2(role, parts, item)


def _input_message(item: str | dict[str, Any], where: str) -> dict[str, Any]:
    """One message of a generate / stream body: `_message`'s shapes, plus what the client sends to
    go on after a client tool: AI SDK model messages (an assistant's tool-call parts, a ``tool``
    message's tool-result parts) and UI messages (``parts`` with ``tool-invocation`` parts)."""
    if isinstance(item, str):
        return _message(item, where)
    role = item.get("role", "user")
    if isinstance(item.get("parts"), list) and not isinstance(item.get("content"), dict):
        if role not in ("user", "assistant"):
            raise BadRequestError(
                f"{where}.role: a UI message is from the user or the assistant, got {role!r}"
            )
        return _ui_message(item, role, where)
    if role == "tool":
        if not isinstance(item.get("content"), list) or not item["content"]:
            raise BadRequestError(f"{where}.content: a tool message holds a list of tool-result parts")
        return _model_message(item, role, where)
    if role in ("user", "assistant") and isinstance(item.get("content"), list):
        return _model_message(item, role, where)
    return _message(item, where)


def _client_tools(tools: dict[str, Any], field: str = "clientTools") -> list[ClientTool]:
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


_CALLER_SET_IDS = ("threadId", "resourceId")


def _own_ids(messages: list[dict[str, Any]], caller: Caller) -> None:
    """Set what the server decides on an input message: its thread and resource are the run's
    (a message's own are dropped, for every caller), and its id is a new one unless the caller is an
    operator (a trusted layer that keeps its ids).

    Like the run-level ids, these scope per-user data (memory, cache entries) that processors see.
    """
    for message in messages:
        for key in _CALLER_SET_IDS:
            message.pop(key, None)
        if not caller.operator or not message.get("id"):
            message["id"] = msgs.new_id()


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
    body = _validated(_Body, data)
    if isinstance(body.messages, str):
        agent_input: str | list[dict[str, Any]] = body.messages
    else:
        agent_input = [_input_message(m, f"messages.{i}") for i, m in enumerate(body.messages)]
        _own_ids(agent_input, caller)
    named = "requestContext" if body.request_context else "runtimeContext"
    context = trust.check(caller, body.request_context or body.runtime_context or {}, named)
    memory = body.memory or _MemoryBody()
    thread, resource = memory_scope(
        body.thread_id or memory.thread_id, body.resource_id or memory.resource, caller=caller
    )
    try:
        stop_when = stop.parse(body.stop_when) if body.stop_when is not None else None
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None
    return AgentCall(
        agent_input,
        CallOptions(
            max_steps=body.max_steps,
            max_processor_retries=body.max_processor_retries,
            request_context=context,
            resource_id=resource,
            thread_id=thread,
            stop_when=stop_when,
            require_tool_approval=body.require_tool_approval,
            client_tools=_client_tools(body.client_tools or {}),
            announce_violations=True,  # a remote caller has no onViolation: its stream tells it
            **_step_kwargs(body),
        ),
        durable=body.durable,
        lanes=_lane_ids(body),
    )


_M = TypeVar("_M", bound=BaseModel)


def _validated(model: type[_M], data: Any) -> _M:
    """`data` as `model`; a 400 naming every problem by its field (the reference's names)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors()
        )
        raise BadRequestError(problems) from None


def _step_kwargs(body: _StepOptions) -> dict[str, Any]:
    """The `CallOptions` fields of the options both APIs share."""
    instructions = _system_texts(body.instructions, "instructions")
    tool_choice: Any = body.tool_choice
    if isinstance(tool_choice, _ToolChoice):
        tool_choice = {"type": "tool", "toolName": tool_choice.tool_name}
    return {
        "instructions": None if instructions is None else "\n\n".join(instructions),
        "system": _system_texts(body.system, "system") or (),
        "model_settings": body.model_settings.wire() if body.model_settings else None,
        "tool_choice": tool_choice,
        "active_tools": body.active_tools,
        "structured_output": _structured_output(body.structured_output),
    }


LANES = ("input", "output", "error")
_MAX_PROCESSOR_ID = 256


def _lane_ids(body: _StepOptions) -> dict[str, list[str]]:
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


def _proto_options(request: Any) -> dict[str, Any]:
    """A GenerateRequest's / StreamRequest's option fields under the HTTP body's names, so that one
    `_StepOptions` validates both (an error names the field as the HTTP body does)."""
    out: dict[str, Any] = {}
    if request.HasField("instructions"):
        out["instructions"] = request.instructions
    if request.system:
        out["system"] = list(request.system)
    if request.HasField("model_settings"):
        out["modelSettings"] = json_format.MessageToDict(request.model_settings)
    if request.HasField("tool_choice"):
        choice = request.tool_choice
        out["toolChoice"] = (
            {"type": "tool", "toolName": choice.tool_name} if choice.mode == "tool" else choice.mode
        )
    if request.HasField("active_tools"):
        out["activeTools"] = list(request.active_tools.names)
    if request.HasField("structured_output"):
        so = request.structured_output
        structured: dict[str, Any] = {"errorStrategy": so.error_strategy or "strict"}
        if so.HasField("schema"):
            structured["schema"] = convert.from_struct(so.schema)
        if so.HasField("fallback_value"):
            structured["fallbackValue"] = convert.from_value(so.fallback_value)
        if so.HasField("instructions"):
            structured["instructions"] = so.instructions
        if so.HasField("model"):
            structured["model"] = so.model
        out["structuredOutput"] = structured
    for kind in LANES:
        if request.HasField(f"{kind}_processors"):
            out[f"{kind}Processors"] = list(getattr(request, f"{kind}_processors").ids)
    return out


def _check_files(message: dict[str, Any], where: str) -> None:
    """A gRPC message's file parts carry what a provider needs: a media type and data or a URL."""
    for i, part in enumerate((message.get("content") or {}).get("parts") or []):
        if part.get("type") != "file":
            continue
        if not part.get("mediaType"):
            raise BadRequestError(f"{where}.content.parts.{i}.file.media_type: a file part needs one")
        if not part.get("data"):
            raise BadRequestError(f"{where}.content.parts.{i}.file: give its url or its data")


def _system_texts(value: Any, field: str) -> list[str] | None:
    """``instructions`` / ``system`` as texts: a string, a system message ``{role, content}``
    (content a string or text parts), or a list of those; None when not given."""
    if value is None:
        return None
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for i, item in enumerate(items):
        where = f"{field}.{i}" if isinstance(value, list) else field
        if isinstance(item, str):
            out.append(item)
            continue
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list) and all(
            isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
        ):
            out.append("".join(p["text"] for p in content))
        else:
            raise BadRequestError(f"{where}: must be a string or a system message {{role, content}}")
    return out


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
        body.schema_, body.error_strategy, body.fallback_value, body.instructions, body.model
    )


def parse_proto(
    request: Any,
    *,
    caller: Caller,
    trust: ContextTrust,
    timeout: float | None,
    limits: InputLimits,
) -> AgentCall:
    """Validate a GenerateRequest / StreamRequest (same fields); thread and resource as `memory_scope`."""
    check_message_count(len(request.messages), limits)
    messages: list[dict[str, Any]] = []
    for i, proto in enumerate(request.messages):
        try:
            message = convert.message_from_proto(proto)
        except ValueError as exc:
            raise BadRequestError(f"messages.{i}: {exc}") from None
        check_input(message, limits, root=("messages", i))
        if message["role"] not in _ROLES:
            raise BadRequestError(f"messages.{i}.role: must be one of {', '.join(_ROLES)}")
        _check_files(message, f"messages.{i}")
        message["id"] = message["id"] or msgs.new_id()
        messages.append(message)
    _own_ids(messages, caller)
    check_input(request.text, limits, root=("text",))
    if request.text:
        messages.append(msgs.text_message("user", request.text))
    if not messages:
        raise BadRequestError("give 'messages' or 'text'")
    max_steps = request.max_steps if request.HasField("max_steps") else None
    retries = request.max_processor_retries if request.HasField("max_processor_retries") else None
    if max_steps is not None and max_steps < 1:
        raise BadRequestError("max_steps: must be at least 1")
    if retries is not None and retries < 0:
        raise BadRequestError("max_processor_retries: must not be negative")
    context = convert.from_struct(request.request_context)
    check_input(context, limits, root=("request_context",))
    context = trust.check(caller, context, "request_context")
    check_input(request.thread_id, limits, root=("thread_id",))
    check_input(request.resource_id, limits, root=("resource_id",))
    thread, resource = memory_scope(request.thread_id, request.resource_id, caller=caller)
    tools = {}
    for i, tool in enumerate(request.client_tools):
        if tool.name in tools:
            raise BadRequestError(f"client_tools.{i}.name: {tool.name[:64]!r} is given twice")
        schema = convert.from_struct(tool.input_schema) if tool.HasField("input_schema") else None
        tools[tool.name] = {"description": tool.description, "inputSchema": schema}
    check_input(tools, limits, root=("client_tools",))
    conditions: list[dict[str, Any]] = []
    for condition in request.stop_when:
        kind = condition.WhichOneof("condition")
        if kind == "step_count_is":
            conditions.append({"stepCountIs": condition.step_count_is})
        elif kind == "has_tool_call":
            conditions.append({"hasToolCall": condition.has_tool_call})
        else:
            conditions.append({})
    try:
        stop_when = stop.parse(conditions, "stop_when") if conditions else None
    except ValueError as exc:
        raise BadRequestError(str(exc)) from None
    approval = request.require_tool_approval if request.HasField("require_tool_approval") else None
    options = _proto_options(request)
    check_input(options, limits, root=("options",))
    step = _validated(_StepOptions, options)
    return AgentCall(
        messages,
        CallOptions(
            max_steps=max_steps,
            max_processor_retries=retries,
            request_context=context,
            timeout=timeout,
            resource_id=resource,
            thread_id=thread,
            stop_when=stop_when,
            require_tool_approval=approval,
            client_tools=_client_tools(tools, "client_tools"),
            announce_violations=True,
            **_step_kwargs(step),
        ),
        durable=request.durable,
        lanes=_lane_ids(step),
    )


@dataclass
class Decision:
    """A validated approve / decline request: which run, which call, and why (a decline)."""

    run_id: str
    tool_call_id: str
    reason: str | None
    request_context: dict[str, Any]


class _DecisionBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    run_id: str = Field(alias="runId", min_length=1, max_length=MAX_ID_CHARS)
    tool_call_id: str = Field(alias="toolCallId", min_length=1, max_length=MAX_ID_CHARS)
    reason: str | None = Field(default=None, max_length=4096)
    request_context: dict[str, Any] | None = Field(default=None, alias="requestContext")


def parse_decision(data: Any, *, caller: Caller, trust: ContextTrust, limits: InputLimits) -> Decision:
    """The body of approve-tool-call / decline-tool-call (and the -generate routes); its request
    context as `trust` allows `caller`."""
    if not isinstance(data, dict):
        raise BadRequestError("the body must be a JSON object with 'runId' and 'toolCallId'")
    check_input(data, limits)
    body = _validated(_DecisionBody, data)
    context = trust.check(caller, body.request_context or {})
    return Decision(body.run_id, body.tool_call_id, body.reason, context)


# -- results and chunks ------------------------------------------------------------------------


def model_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Response messages as AI SDK model messages: the assistant's text and tool-call parts, and a
    ``tool`` message with the results of the calls that have one (what the client sends back)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        content: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for part in (message.get("content") or {}).get("parts") or []:
            if part.get("type") == "text" and part.get("text"):
                content.append({"type": "text", "text": part["text"]})
            elif part.get("type") == "tool-invocation":
                inv = part["toolInvocation"]
                call = {"toolCallId": inv["toolCallId"], "toolName": inv["toolName"]}
                content.append({"type": "tool-call", **call, "input": inv.get("args")})
                if inv.get("state") == "result":
                    output = {"type": "json", "value": inv.get("result")}
                    results.append({"type": "tool-result", **call, "output": output})
        if content:
            out.append({"role": "assistant", "content": content})
        if results:
            out.append({"role": "tool", "content": results})
    return out


def _call_chunks(calls: list[dict[str, Any]], run_id: str) -> list[Chunk]:
    """Tool calls as the reference's ``tool-call`` chunks (``response.toolCalls``)."""
    return [
        {
            "type": "tool-call",
            "runId": run_id,
            "from": "AGENT",
            "payload": {
                "toolCallId": call.get("toolCallId"),
                "toolName": call.get("toolName"),
                "args": call.get("args"),
            },
        }
        for call in calls
    ]


def _result_chunks(results: list[dict[str, Any]], run_id: str) -> list[Chunk]:
    """Tool results as the reference's ``tool-result`` chunks."""
    return [{"type": "tool-result", "runId": run_id, "from": "AGENT", "payload": dict(r)} for r in results]


def all_calls(result: RunResult) -> list[dict[str, Any]]:
    """Every step's tool calls, then the suspended ones (their step is not recorded yet)."""
    calls = [call for step in result.steps for call in step.get("toolCalls") or []]
    seen = {call.get("toolCallId") for call in calls}
    return calls + [call for call in result.suspended if call.get("toolCallId") not in seen]


def all_results(result: RunResult) -> list[dict[str, Any]]:
    """Every step's tool results."""
    return [r for step in result.steps for r in step.get("toolResults") or []]


def result_json(result: RunResult) -> dict[str, Any]:
    """The generate() result as the reference server returns it (camelCase), with `status`.

    ``toolCalls`` holds every step's calls as ``tool-call`` chunks (the client runs those of its
    client tools at finish reason ``tool-calls``; ``response.messages`` are then AI SDK model
    messages, the stored form in ``response.dbMessages``), the one awaiting approval last
    (finish reason ``suspended``, also as ``suspendPayload``); ``toolResults`` their results as
    ``tool-result`` chunks. Each step's ``toolCalls`` are chunks too.
    """
    response: dict[str, Any] = {"messages": result.response_messages}
    if result.finish_reason == "tool-calls" and result.steps and result.status != "suspended":
        response = {
            "messages": model_messages(result.response_messages),
            "dbMessages": result.response_messages,
        }
    response["modelId"] = result.model_id  # the model that answered (a fallback, when one did)
    run_id = result.run_id
    steps = [{**s, "toolCalls": _call_chunks(s.get("toolCalls") or [], run_id)} for s in result.steps]
    out: dict[str, Any] = {
        "runId": run_id,
        "status": result.status,
        "text": result.text,
        "finishReason": result.finish_reason,
        "steps": steps,
        "usage": result.usage,
        "totalUsage": result.usage,
        "tripwire": result.tripwire,
        "toolCalls": _call_chunks(all_calls(result), run_id),
        "toolResults": _result_chunks(all_results(result), run_id),
        "messages": result.response_messages,
        "response": response,
        "violations": result.violations,
        "traceId": result.trace_id,
        "object": result.object,
    }
    if result.status == "suspended" and result.suspended:
        first = result.suspended[0]
        out["suspendPayload"] = {k: first.get(k) for k in ("toolCallId", "toolName", "args")}
    if result.error is not None:
        out["error"] = result.error
    return out


def failed_json(error: BaseException) -> dict[str, Any]:
    """The result of a run that raised: the partial result when the error carries one."""
    partial = getattr(error, "result", None)
    if isinstance(partial, RunResult):
        out = result_json(partial)
    else:
        out = {
            "runId": None,
            "text": "",
            "finishReason": "error",
            "steps": [],
            "usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
            "tripwire": None,
            "totalUsage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
            "toolCalls": [],
            "toolResults": [],
            "messages": [],
            "response": {"messages": []},
            "violations": [],
            "traceId": None,
            "object": None,
        }
    out["status"] = "failed"
    out["finishReason"] = "error"
    out["error"] = str(error)
    return out


def wire_chunk(chunk: Chunk, run_id: str) -> Chunk:
    """A chunk as the reference server streams it: ``runId`` and ``from: "AGENT"`` added.

    ``step-finish`` and ``finish`` also get ``payload.stepResult.reason`` (where the
    reference client reads the finish reason), besides the ``finishReason`` we send.
    """
    out = {**chunk, "runId": run_id, "from": "AGENT"}
    if chunk.get("type") in ("finish", "step-finish"):
        payload = dict(chunk.get("payload") or {})
        payload.setdefault("stepResult", {"reason": payload.get("finishReason", "stop")})
        out["payload"] = payload
    return out


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def dumps(value: Any) -> str:
    """Compact JSON; bytes (inline file data) as base64."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_json_default)


# -- the run gate --------------------------------------------------------------------------------

GateState = Literal["open", "draining"]


class RunGate:
    """Counts in-flight runs and refuses new ones once draining (SIGTERM)."""

    def __init__(self) -> None:
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.state: GateState = "open"

    @property
    def active(self) -> int:
        """Runs in flight."""
        return self._active

    @property
    def draining(self) -> bool:
        """True once `drain()` was called."""
        return self.state == "draining"

    def enter(self) -> None:
        """Admit a run (raises DrainingError when draining); pair with `leave()`."""
        if self.draining:
            raise DrainingError("the server is shutting down and takes no new runs; retry on another replica")
        self._active += 1
        self._idle.clear()

    def leave(self) -> None:
        """A run ended."""
        self._active -= 1
        if self._active == 0:
            self._idle.set()

    def drain(self) -> None:
        """Refuse new runs from now on."""
        self.state = "draining"

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no run is in flight; False when `timeout` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
