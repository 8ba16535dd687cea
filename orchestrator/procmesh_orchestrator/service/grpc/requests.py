"""The gRPC API's requests: a GenerateRequest / StreamRequest validated into the same `AgentCall` as
the HTTP body (its option fields under the body's names through one `StepOptions`)."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from procmesh import convert
from procmesh_orchestrator.run import CallOptions, stop
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service._limits import InputLimits, check_input, check_message_count
from procmesh_orchestrator.service._trust import ContextTrust
from procmesh_orchestrator.service.api.call_memory import memory_scope
from procmesh_orchestrator.service.api.call_options import (
    LANES,
    StepOptions,
    client_tools,
    lane_ids,
    step_kwargs,
    validated,
)
from procmesh_orchestrator.service.api.calls import AgentCall
from procmesh_orchestrator.service.api.messages import ROLES, own_ids
from procmesh_orchestrator.service.grpc.memory import memory_options


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
        if message["role"] not in ROLES:
            raise BadRequestError(f"messages.{i}.role: must be one of {', '.join(ROLES)}")
        _check_files(message, f"messages.{i}")
        message["id"] = message["id"] or msgs.new_id()
        messages.append(message)
    own_ids(messages, caller)
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
    context, dropped = trust.admit(caller, context, "request_context")
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
    step = validated(StepOptions, options)
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
            client_tools=client_tools(tools, "client_tools"),
            memory=memory_options(request),
            announce_violations=True,
            **step_kwargs(step),
        ),
        durable=request.durable,
        lanes=lane_ids(step),
        dropped_context=dropped,
    )


def _proto_options(request: Any) -> dict[str, Any]:
    """A GenerateRequest's / StreamRequest's option fields under the HTTP body's names, so that one
    `StepOptions` validates both (an error names the field as the HTTP body does)."""
    out: dict[str, Any] = {}
    if request.HasField("instructions"):
        out["instructions"] = request.instructions
    if request.system:
        out["system"] = list(request.system)
    if request.HasField("model_settings"):
        out["modelSettings"] = json_format.MessageToDict(request.model_settings)
    if request.HasField("tool_choice"):
        choice = request.tool_choice
        if choice.tool_name and choice.mode != "tool":
            # the one tool would not be forced: the model could call any tool, or none
            raise BadRequestError(
                f"tool_choice.tool_name: names the tool of mode 'tool' only (mode is {choice.mode!r}); "
                "set mode 'tool' or leave tool_name out"
            )
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
        if so.HasField("json_prompt_injection"):
            structured["jsonPromptInjection"] = so.json_prompt_injection
        out["structuredOutput"] = structured
    for kind in LANES:
        if request.HasField(f"{kind}_processors"):
            out[f"{kind}Processors"] = list(getattr(request, f"{kind}_processors").ids)
    if request.prepare_steps:
        out["prepareSteps"] = [_step_rule(rule) for rule in request.prepare_steps]
    return out


def _step_rule(struct: Any) -> dict[str, Any]:
    """A ``prepare_steps`` entry as JSON: a Struct's numbers are doubles, a step number an int."""
    rule = convert.from_struct(struct)
    when = rule.get("when")
    if isinstance(when, dict):
        rule["when"] = {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in when.items()}
    return rule


def _check_files(message: dict[str, Any], where: str) -> None:
    """A gRPC message's file parts carry what a provider needs: a media type and data or a URL."""
    for i, part in enumerate((message.get("content") or {}).get("parts") or []):
        if part.get("type") != "file":
            continue
        if not part.get("mediaType"):
            raise BadRequestError(f"{where}.content.parts.{i}.file.media_type: a file part needs one")
        if not part.get("data"):
            raise BadRequestError(f"{where}.content.parts.{i}.file: give its url or its data")
