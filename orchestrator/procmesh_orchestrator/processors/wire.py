"""The per-hook wire mapping: a run's hook arguments -> request message, response -> result, effects;
a failed call's status -> the error its failure policy reads (`call_error`).

Request and response classes and RPC names come from the SDK's hook table (`procmesh.hooks`);
this module adds only what each hook's fields mean to the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import grpc

from procmesh import convert
from procmesh.errors import ProcmeshError
from procmesh.hooks import BY_NAME
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError, ProcessorCallError, TripwireAbort
from procmesh_orchestrator.processors.encodings import Fill, MessageEncodings, length_delimited
from procmesh_orchestrator.run import hooks as h

Build = Callable[[Any, Any, Fill], None]
"""(hook arguments, an empty request, how messages go in) -> fills the request (its context aside)."""
Read = Callable[[Any], Any]
"""A response -> the hook's result."""


def _convert(request: Any, field: str, messages: list[dict[str, Any]]) -> None:
    """Messages converted for this request alone (no run's `MessageEncodings` to reuse)."""
    repeated = getattr(request, field)
    for m in messages:
        convert.message_to_proto(m, repeated.add())


def _steps(field: Any, steps: list[dict[str, Any]]) -> None:
    for step in steps:
        convert.step_to_proto(step, field.add())


def _struct(field: Any, value: dict[str, Any] | None) -> None:
    """Set a Struct field, present even when empty (as a copied empty Struct leaves it)."""
    if value:
        field.CopyFrom(convert.to_struct(value))
    else:
        field.SetInParent()


def _returned(field: Any) -> list[dict[str, Any]]:
    return [convert.message_from_proto(m) for m in field]


def _build_input(a: h.InputArgs, req: Any, fill: Fill) -> None:
    fill(req, "messages", a.messages)
    fill(req, "all_messages", a.all_messages)
    fill(req, "system_messages", a.system_messages)


def _read_input(resp: Any) -> h.InputResult:
    return h.InputResult(
        messages=_returned(resp.messages) if resp.replace_messages else None,
        all_messages=_returned(resp.all_messages) if resp.replace_all_messages else None,
        system_messages=_returned(resp.system_messages) if resp.replace_system_messages else None,
    )


def _build_input_step(a: h.InputStepArgs, req: Any, fill: Fill) -> None:
    req.model = a.model
    fill(req, "messages", a.messages)
    fill(req, "system_messages", a.system_messages)
    for tool in a.tools:
        t = req.tools.add(name=tool["name"], description=tool.get("description", ""))
        t.input_schema.CopyFrom(convert.to_struct(tool.get("inputSchema")))
    if isinstance(a.tool_choice, dict):
        req.tool_choice.mode = "tool"
        req.tool_choice.tool_name = a.tool_choice.get("toolName", "")
    elif a.tool_choice:
        req.tool_choice.mode = a.tool_choice
    req.active_tools.extend(a.active_tools or [])
    _struct(req.provider_options, a.provider_options)
    _struct(req.model_settings, a.model_settings)
    _steps(req.steps, a.steps)


def _read_input_step(resp: Any) -> h.InputStepResult:
    out = h.InputStepResult()
    if resp.replace_messages:
        out.messages = _returned(resp.messages)
    if resp.replace_system_messages:
        out.system_messages = _returned(resp.system_messages)
    if resp.HasField("model"):
        out.model = resp.model
    if resp.replace_tools:
        out.tools = [
            {"name": t.name, "description": t.description, "inputSchema": convert.from_struct(t.input_schema)}
            for t in resp.tools
        ]
    if resp.tool_choice.mode:
        out.tool_choice = (
            {"type": "tool", "toolName": resp.tool_choice.tool_name}
            if resp.tool_choice.mode == "tool"
            else resp.tool_choice.mode
        )
    if resp.replace_active_tools:
        out.active_tools = list(resp.active_tools)
    if resp.provider_options.fields:
        out.provider_options = convert.from_struct(resp.provider_options)
    if resp.model_settings.fields:
        out.model_settings = convert.from_struct(resp.model_settings)
    return out


def _build_llm_request(a: h.LLMRequestArgs, req: Any, fill: Fill) -> None:
    req.model = a.model
    req.model_spec_version = a.model_spec_version
    convert.prompt_to_proto(a.prompt, req.prompt)
    _steps(req.steps, a.steps)


def _read_llm_request(resp: Any) -> h.LLMRequestResult:
    return h.LLMRequestResult(
        prompt=convert.prompt_from_proto(resp.prompt) if resp.replace_prompt else None,
        cached_response=(
            [convert.chunk_from_proto(c) for c in resp.cached_response] if resp.has_cached_response else None
        ),
        cached_tool_results=[
            {
                "toolCallId": r.tool_call_id,
                "toolName": r.tool_name,
                "args": convert.from_value(r.args),
                "result": convert.from_value(r.result),
            }
            for r in resp.cached_tool_results
        ]
        if resp.has_cached_response
        else [],
    )


def _build_llm_response(a: h.LLMResponseArgs, req: Any, fill: Fill) -> None:
    req.model = a.model
    req.from_cache = a.from_cache
    for chunk in a.chunks:
        convert.chunk_to_proto(chunk, req.chunks.add())
    _steps(req.steps, a.steps)


def _build_output_step(a: h.OutputStepArgs, req: Any, fill: Fill) -> None:
    req.text = a.text
    req.finish_reason = a.finish_reason
    fill(req, "messages", a.messages)
    fill(req, "system_messages", a.system_messages)
    for call in a.tool_calls:
        tc = req.tool_calls.add(tool_call_id=call["toolCallId"], tool_name=call["toolName"])
        tc.args.CopyFrom(convert.to_value(call.get("args")))
    convert.usage_to_proto(a.usage, req.usage)
    _steps(req.steps, a.steps)


def _read_messages(resp: Any) -> h.MessagesResult:
    return h.MessagesResult(messages=_returned(resp.messages) if resp.replace_messages else None)


def _build_tool_result(a: h.ToolResultArgs, req: Any, fill: Fill) -> None:
    req.tool_name = a.tool_name
    req.tool_call_id = a.tool_call_id
    req.args.CopyFrom(convert.to_value(a.args))
    req.result.CopyFrom(convert.to_value(a.result))
    fill(req, "messages", a.messages)
    _steps(req.steps, a.steps)


def _read_tool_result(resp: Any) -> h.ToolResultResult:
    if not resp.replace_result:
        return h.ToolResultResult()
    return h.ToolResultResult(replaced=True, result=convert.from_value(resp.result))


def _build_output_result(a: h.OutputResultArgs, req: Any, fill: Fill) -> None:
    fill(req, "messages", a.messages)
    req.result.text = a.text
    req.result.finish_reason = a.finish_reason
    convert.usage_to_proto(a.usage, req.result.usage)
    _steps(req.result.steps, a.steps)


def _build_api_error(a: h.APIErrorArgs, req: Any, fill: Fill) -> None:
    req.error.status = a.status
    req.error.message = a.message
    req.error.body = a.body
    req.error.retryable = a.retryable
    req.error.id = a.error_id
    req.error.details.CopyFrom(convert.to_struct(a.details))
    fill(req, "messages", a.messages)
    _steps(req.steps, a.steps)


def _read_api_error(resp: Any) -> h.APIErrorResult:
    return h.APIErrorResult(
        messages=_returned(resp.messages) if resp.replace_messages else None,
        retry=resp.retry,
        retry_delay_ms=max(0.0, resp.retry_delay_ms) if math.isfinite(resp.retry_delay_ms) else 0.0,
    )


def _build_execute_tool(a: h.ExecuteToolArgs, req: Any, fill: Fill) -> None:
    req.tool_name = a.tool_name
    req.tool_call_id = a.tool_call_id
    req.args.CopyFrom(convert.to_value(a.args))
    fill(req, "messages", a.messages)
    if a.resumed is not None:
        req.resume_data.CopyFrom(convert.to_value(a.resumed.data))
        req.suspend_payload.CopyFrom(convert.to_value(a.resumed.suspend_payload))


def _read_execute_tool(resp: Any) -> h.ExecuteToolResult:
    if resp.HasField("suspend_payload"):
        payload = convert.from_value(resp.suspend_payload)
        return h.ExecuteToolResult(suspended=h.Suspension(payload, resp.resume_schema or None))
    if resp.error:
        return h.ExecuteToolResult(error=resp.error)
    shown = convert.from_value(resp.model_output) if resp.HasField("model_output") else None
    return h.ExecuteToolResult(result=convert.from_value(resp.result), model_output=shown)


WIRE: dict[str, tuple[Build, Read]] = {
    "process_input": (_build_input, _read_input),
    "process_input_step": (_build_input_step, _read_input_step),
    "process_llm_request": (_build_llm_request, _read_llm_request),
    "process_llm_response": (
        _build_llm_response,
        lambda resp: h.LLMResponseResult(output_result_if_clean=resp.output_result_if_clean),
    ),
    "process_output_step": (_build_output_step, _read_messages),
    "process_tool_result": (_build_tool_result, _read_tool_result),
    "process_output_result": (_build_output_result, _read_messages),
    "process_api_error": (_build_api_error, _read_api_error),
    "execute_tool": (_build_execute_tool, _read_execute_tool),
}
"""Every unary hook of `procmesh.hooks.HOOKS`: how its arguments are sent and its answer read."""

assert set(WIRE) == {hook.name for hook in BY_NAME.values() if not hook.streaming}, "a hook lacks its wire"


def _flagged(response: Any) -> tuple[tuple[str, tuple[tuple[str, bool], ...]], ...]:
    """A response's result fields read only when a flag is set, each with whether it is repeated:
    ``replace_X`` / ``X``, and ``has_cached_response`` / its chunks and tool results."""
    names = response.DESCRIPTOR.fields_by_name
    pairs: list[tuple[str, tuple[str, ...]]] = [
        (name, (name.removeprefix("replace_"),)) for name in names if name.startswith("replace_")
    ]
    if "has_cached_response" in names:
        pairs.append(("has_cached_response", ("cached_response", "cached_tool_results")))
    return tuple(
        (flag, tuple((field, names[field].is_repeated) for field in fields)) for flag, fields in pairs
    )


_FLAGGED = {hook: _flagged(BY_NAME[hook].response) for hook in WIRE}


def check_flags(hook: str, response: Any) -> None:
    """`MalformedResponseError` naming a result field `response` sets while the flag it is read
    under is false (and a ProcessInputStep ``tool_choice.tool_name`` whose mode is not ``tool``):
    the run would go on without it, so a guard's redaction written without ``replace_messages``
    would let the text through, without a word (proto/README.md, "The replace_* flags")."""
    for flag, fields in _FLAGGED[hook]:
        if getattr(response, flag):
            continue
        for field, repeated in fields:
            if len(getattr(response, field)) if repeated else response.HasField(field):
                raise MalformedResponseError(
                    f"{field} is set but {flag} is false: the orchestrator reads {field} only with "
                    f"{flag} set (set it, or leave {field} empty)"
                )
    if hook == "execute_tool":
        _check_tool_answer(response)
    elif hook == "process_input_step":
        choice = response.tool_choice
        if choice.tool_name and choice.mode != "tool":
            raise MalformedResponseError(
                f"tool_choice.tool_name is set but tool_choice.mode is {choice.mode!r}: "
                "a tool is named with mode 'tool' only"
            )


def _check_tool_answer(response: Any) -> None:
    """An ExecuteToolResponse is one answer: a suspension, an error or a result; fields of another
    answer beside it would be dropped (proto/README.md, ExecuteTool)."""
    suspended = response.HasField("suspend_payload")
    beside = [
        name
        for name, given in (
            ("result", response.HasField("result")),
            ("model_output", response.HasField("model_output")),
            ("error", bool(response.error)),
        )
        if given and (suspended or name != "error")
    ]
    if suspended and beside:
        raise MalformedResponseError(
            f"{', '.join(beside)} set beside suspend_payload: a suspended call has no result or error"
        )
    if response.error and beside:
        raise MalformedResponseError(f"{', '.join(beside)} set beside error: a failed tool has no result")
    if response.resume_schema and not suspended:
        raise MalformedResponseError("resume_schema set without suspend_payload")


CONTEXT_FIELD = 1
"""Every unary hook's request carries its RunContext as field 1 (``context``)."""

assert all(
    BY_NAME[hook].request.DESCRIPTOR.fields_by_name["context"].number == CONTEXT_FIELD for hook in WIRE
), "a unary request's context is not field 1"


def build_request(args: h.HookArgs[Any]) -> Any:
    """The request message for `args`, its RunContext empty, every message converted afresh
    (what `encode_request` must equal: the tests' and the bench's reference)."""
    request = BY_NAME[args.hook].request()
    WIRE[args.hook][0](args, request, _convert)
    return request


def encode_request(args: h.HookArgs[Any], encodings: MessageEncodings) -> bytes:
    """The request for `args` serialized, its RunContext aside (`context_field` appends it): each
    message's encoding is the run's `encodings`', reused while the message is unchanged."""
    request = BY_NAME[args.hook].request()
    build = WIRE[args.hook][0]
    return encodings.encode(request, lambda fill: build(args, request, fill))


def context_field(context: bytes) -> bytes:
    """A serialized RunContext as the ``context`` field of a serialized request (appended to it)."""
    return length_delimited(CONTEXT_FIELD, context)


def read_result(hook: str, response: Any) -> Any:
    """The run's result of a hook's response."""
    return WIRE[hook][1](response)


def empty_response(hook: str) -> Any:
    """A response that changes nothing (a parallel group whose picked branch gave none)."""
    return BY_NAME[hook].response()


def read_effects(
    processor_id: str,
    hook: str,
    effects: tpb.HookEffects,
    *,
    decode_chunks: bool = True,
    source: tuple[str, str] | None = None,
) -> h.Effects:
    """Validate and convert a response's effects (its state is the caller's to store, at commit).

    With ``decode_chunks=False`` the custom chunks are only validated: the output stream
    forwards them as the protobuf they are. `source` (the entry's sidecar and hosted id) goes on
    its violations and abort, for their metrics' labels.
    """
    out = h.Effects()
    for chunk in effects.custom_chunks:
        if not chunk.type.startswith("data-"):
            raise MalformedResponseError(f"custom chunk type must start with 'data-', got {chunk.type!r}")
        if decode_chunks:
            out.custom_chunks.append(convert.chunk_from_proto(chunk))
    for signal in effects.signals:
        if not signal.contents and not signal.type:
            raise MalformedResponseError("signal without type or contents")
        out.signals.append(convert.signal_from_proto(signal))
    for violation in effects.violations:
        detail = convert.from_value(violation.detail) if violation.HasField("detail") else None
        out.violations.append(h.Violation(processor_id, violation.message, detail, source))
    if effects.HasField("request_context_updates"):
        if hook == "process_output_stream":
            raise MalformedResponseError(
                "ProcessOutputStream cannot set request-context values (a unary hook can)"
            )
        out.context = convert.from_struct(effects.request_context_updates)
    if effects.HasField("abort"):
        ab = effects.abort
        reason = ab.reason or f"Tripwire triggered by {processor_id}"
        metadata = convert.from_value(ab.metadata) if ab.HasField("metadata") else None
        out.abort = TripwireAbort(processor_id, reason, ab.retry, metadata, hook, source)
    return out


def call_error(err: ProcmeshError) -> ProcessorCallError:
    """A processor call's failed status (`procmesh.translate_rpc_error`'s error) as the failure
    policy reads it, for unary hooks and output-stream sessions alike: the code named in the
    message; INVALID_ARGUMENT, the sidecar refusing the input itself, marks `input_refused`."""
    refused = err.code == grpc.StatusCode.INVALID_ARGUMENT
    return ProcessorCallError(f"{err.code.name}: {err}", input_refused=refused)
