"""Per-hook encoders: a hook's return value -> its response message, and the effects encoder.

An encoder is called only when the hook did not abort (an aborted call answers the empty
response with the abort in its effects). It receives the keyword arguments the hook was
handed, so in-place edits of ``message_list`` are sent back. Everything an encoder reads came
from the processor, so a value that cannot be sent is the processor's fault: ``InternalError``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from procmesh import convert
from procmesh._message_list import MessageList
from procmesh.errors import InternalError
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb

if TYPE_CHECKING:
    # Only for the annotation: importing _processor would cycle (hooks -> _encode -> _processor -> hooks).
    from procmesh._processor import HookEffects

Kwargs = dict[str, Any]
_Replaced = TypeVar("_Replaced", ppb.ProcessOutputStepResponse, ppb.ProcessOutputResultResponse)

_STEP_OVERRIDES = frozenset(
    {
        "messages",
        "system_messages",
        "model",
        "tools",
        "tool_choice",
        "active_tools",
        "provider_options",
        "model_settings",
    }
)


_UNREAD = MessageList([])
"""The message list of a hook that did not declare it: never edited."""


def _message_list(kwargs: Kwargs) -> MessageList:
    """The hook's message list, or an unedited one when it did not take it (its request was not decoded)."""
    found: MessageList = kwargs.get("message_list", _UNREAD)
    return found


def fill_messages(field: Any, messages: Any, hook: str) -> None:
    """Append `messages` (a list of message dicts or a MessageList) to a repeated Message field."""
    if isinstance(messages, MessageList):
        messages = messages.get_all()
    if not isinstance(messages, list):
        raise InternalError(f"{hook} returned messages of type {type(messages).__name__}; expected a list")
    for msg in messages:
        if not isinstance(msg, dict):
            raise InternalError(f"{hook} returned a message of type {type(msg).__name__}; expected a dict")
        try:
            convert.message_to_proto(msg, field.add())
        except (ValueError, TypeError) as exc:
            raise InternalError(f"{hook} returned a malformed message: {exc}") from exc


def fill_effects(out: tpb.HookEffects, effects: HookEffects, state: dict[str, Any] | None) -> None:
    """Write abort, signals, custom chunks, violations, request-context values and (unless None)
    the state into `out`."""
    # Everything here came from the hook (state included): a conversion failure is the
    # processor's fault (INTERNAL), not a malformed request (INVALID_ARGUMENT).
    try:
        _fill_effects_unchecked(out, effects, state)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InternalError(
            f"processor {effects.processor_id!r} left effects or state that cannot be sent: {exc}"
        ) from exc


_QUIET: dict[int, tpb.HookEffects] = {}


def quiet_effects(processors: int) -> tpb.HookEffects:
    """The effects of an answer in which none of a call's `processors` did anything: empty, and
    for a fused call one empty outcome per further processor (present even when empty, as the
    outcomes `fill_effects` is given to fill).

    A fused pass-through answer carries exactly these (`_chain`), and the orchestrator commits an
    answer carrying them at once, as a plain pass; anything else goes its long way. One message
    per count, shared: copy it, never change it.
    """
    quiet = _QUIET.get(processors)
    if quiet is None:
        quiet = tpb.HookEffects()
        for _ in range(processors - 1):
            quiet.fused.add().effects.SetInParent()
        _QUIET[processors] = quiet
    return quiet


def _fill_effects_unchecked(out: tpb.HookEffects, effects: HookEffects, state: dict[str, Any] | None) -> None:
    if effects.abort is not None:
        convert.abort_to_proto(
            {
                "reason": effects.abort.reason,
                "retry": effects.abort.retry,
                "metadata": effects.abort.metadata,
            },
            out.abort,
        )
    for signal in effects.signals:
        convert.signal_to_proto(signal, out.signals.add())
    for chunk in effects.custom_chunks:
        convert.chunk_to_proto(chunk, out.custom_chunks.add())
    for message, detail in effects.violations:
        v = out.violations.add()
        v.message = message
        if detail is not None:
            v.detail.CopyFrom(convert.to_value(detail))
    if state is not None:
        out.state.CopyFrom(convert.to_struct(state))
    if effects.context_updates:
        out.request_context_updates.CopyFrom(convert.to_struct(effects.context_updates))


def process_input(result: Any, kwargs: Kwargs) -> ppb.ProcessInputResponse:
    """A list (new messages), a dict with messages/system_messages, the message_list, or None."""
    hook = "process_input"
    message_list: MessageList = _message_list(kwargs)
    resp = ppb.ProcessInputResponse()
    if message_list.modified:
        resp.replace_all_messages = True
        fill_messages(resp.all_messages, message_list, hook)
    if isinstance(result, dict):
        if "messages" in result:
            resp.replace_messages = True
            fill_messages(resp.messages, result["messages"], hook)
        if "system_messages" in result:
            resp.replace_system_messages = True
            fill_messages(resp.system_messages, result["system_messages"], hook)
    elif isinstance(result, list):
        resp.replace_messages = True
        fill_messages(resp.messages, result, hook)
    elif result is not None and result is not message_list:
        raise InternalError(
            f"{hook} returned {type(result).__name__}; expected a list of messages, "
            "a dict with messages/system_messages, the message_list or None"
        )
    return resp


def process_input_step(result: Any, kwargs: Kwargs) -> ppb.ProcessInputStepResponse:
    """A dict of step overrides, a list of messages, the message_list, or None."""
    hook = "process_input_step"
    message_list: MessageList = _message_list(kwargs)
    resp = ppb.ProcessInputStepResponse()
    if message_list.modified:
        resp.replace_messages = True
        fill_messages(resp.messages, message_list, hook)
    if isinstance(result, list | MessageList) and result is not message_list:
        resp.replace_messages = True
        del resp.messages[:]
        fill_messages(resp.messages, result, hook)
    elif isinstance(result, dict):
        _fill_step_overrides(resp, result)
    elif result is not None and result is not message_list:
        raise InternalError(
            f"{hook} returned {type(result).__name__}; expected a dict of "
            "step overrides, a list of messages, the message_list or None"
        )
    return resp


def _fill_step_overrides(resp: ppb.ProcessInputStepResponse, result: dict[str, Any]) -> None:
    unknown = set(result) - _STEP_OVERRIDES
    if unknown:
        raise InternalError(f"process_input_step returned unknown keys {sorted(unknown)}")
    if "messages" in result:
        resp.replace_messages = True
        del resp.messages[:]
        fill_messages(resp.messages, result["messages"], "process_input_step")
    if "system_messages" in result:
        resp.replace_system_messages = True
        fill_messages(resp.system_messages, result["system_messages"], "process_input_step")
    if result.get("model"):
        resp.model = str(result["model"])
    if "tools" in result:
        resp.replace_tools = True
        for tool in result["tools"]:
            t = resp.tools.add()
            t.name = tool["name"]
            t.description = tool.get("description", "")
            t.input_schema.CopyFrom(convert.to_struct(tool.get("inputSchema")))
    choice = result.get("tool_choice")
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InternalError(f"process_input_step returned tool_choice {choice!r}")
        resp.tool_choice.mode = choice
    elif isinstance(choice, dict):
        resp.tool_choice.mode = "tool"
        resp.tool_choice.tool_name = choice.get("toolName", "")
    if "active_tools" in result:
        resp.replace_active_tools = True
        resp.active_tools.extend(result["active_tools"])
    if result.get("provider_options"):
        resp.provider_options.CopyFrom(convert.to_struct(result["provider_options"]))
    if result.get("model_settings"):
        resp.model_settings.CopyFrom(convert.to_struct(result["model_settings"]))


def process_llm_request(result: Any, kwargs: Kwargs) -> ppb.ProcessLLMRequestResponse:
    """``{"prompt": [...]}`` and/or ``{"response": [chunks]}`` (a cached answer), or None.

    With a response, ``"tool_results"`` (``[{toolCallId, toolName, args, result}]``) are the recorded
    results of its tool calls: the orchestrator replays them instead of running those tools again.
    """
    resp = ppb.ProcessLLMRequestResponse()
    if result is None:
        return resp
    if not isinstance(result, dict):
        raise InternalError(
            f"process_llm_request returned {type(result).__name__}; "
            "expected {'prompt': [...]} and/or {'response': [chunks]} or None"
        )
    if "prompt" in result:
        resp.replace_prompt = True
        convert.prompt_to_proto(result["prompt"], resp.prompt)
    if result.get("response") is not None:
        resp.has_cached_response = True
        for chunk in result["response"]:
            convert.chunk_to_proto(chunk, resp.cached_response.add())
        for recorded in result.get("tool_results") or []:
            try:
                tr = resp.cached_tool_results.add(
                    tool_call_id=str(recorded["toolCallId"]), tool_name=str(recorded.get("toolName", ""))
                )
                tr.args.CopyFrom(convert.to_value(recorded.get("args")))
                tr.result.CopyFrom(convert.to_value(recorded.get("result")))
            except (KeyError, TypeError) as exc:
                raise InternalError(f"process_llm_request returned a malformed tool result: {exc}") from exc
    return resp


def process_llm_response(result: Any, kwargs: Kwargs) -> ppb.ProcessLLMResponseResponse:
    """The hook observes; ``{"output_result_if_clean": True}`` asks for processOutputResult at the run's
    clean end, whichever lane the processor is in. Any other return value is ignored."""
    resp = ppb.ProcessLLMResponseResponse()
    if isinstance(result, dict):
        resp.output_result_if_clean = bool(result.get("output_result_if_clean", False))
    return resp


def process_output_stream(result: Any, kwargs: Kwargs) -> ppb.StreamPartResult:
    """A chunk dict, a list of them (one part becomes several; empty: dropped), or None (dropped)."""
    hook = "process_output_stream"
    res = ppb.StreamPartResult()
    if result is None:
        return res
    parts = result if isinstance(result, list) else [result]
    for i, chunk in enumerate(parts):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("type"), str):
            raise InternalError(
                f"{hook} returned {type(chunk).__name__}; expected a chunk dict, a list of them, or None"
            )
        try:
            convert.chunk_to_proto(chunk, res.part if i == 0 else res.extra_parts.add())
        except (ValueError, TypeError) as exc:
            raise InternalError(f"{hook} returned a malformed chunk: {exc}") from exc
    return res


def _replacement(resp: _Replaced, result: Any, message_list: MessageList, hook: str) -> _Replaced:
    """Array-style return (or in-place message_list edits) of the output hooks."""
    if isinstance(result, list | MessageList) and result is not message_list:
        if isinstance(result, list) and not result:
            return resp  # the seeds' examples return [] to mean "no change"
        resp.replace_messages = True
        fill_messages(resp.messages, result, hook)
    elif message_list.modified:
        resp.replace_messages = True
        fill_messages(resp.messages, message_list, hook)
    elif result is not None and result is not message_list:
        raise InternalError(f"{hook} returned {type(result).__name__}; expected a list of messages or None")
    return resp


def process_output_step(result: Any, kwargs: Kwargs) -> ppb.ProcessOutputStepResponse:
    """A list of messages (replaces the step's), the message_list, or None."""
    resp = ppb.ProcessOutputStepResponse()
    return _replacement(resp, result, _message_list(kwargs), "process_output_step")


def process_tool_result(result: Any, kwargs: Kwargs) -> ppb.ProcessToolResultResponse:
    """A JSON value replaces the tool's result; None keeps it."""
    resp = ppb.ProcessToolResultResponse()
    if result is not None:
        resp.replace_result = True
        try:
            resp.result.CopyFrom(convert.to_value(result))
        except TypeError as exc:
            raise InternalError(f"process_tool_result returned a non-JSON result: {exc}") from exc
    return resp


def process_output_result(result: Any, kwargs: Kwargs) -> ppb.ProcessOutputResultResponse:
    """A list of messages (replaces the run's), the message_list, or None."""
    resp = ppb.ProcessOutputResultResponse()
    return _replacement(resp, result, _message_list(kwargs), "process_output_result")


def process_api_error(result: Any, kwargs: Kwargs) -> ppb.ProcessAPIErrorResponse:
    """``{"retry": bool, "delay_ms": float}`` or None; in-place message_list edits are sent back too.

    ``delay_ms`` asks the orchestrator to wait before the retry (a Retry-After): the hook returns
    at once instead of sleeping, so the wait is bounded by the run's deadline, not the hook's timeout.
    """
    message_list: MessageList = _message_list(kwargs)
    resp = ppb.ProcessAPIErrorResponse()
    if message_list.modified:
        resp.replace_messages = True
        fill_messages(resp.messages, message_list, "process_api_error")
    if isinstance(result, dict):
        resp.retry = bool(result.get("retry", False))
        delay = result.get("delay_ms", 0)
        if not isinstance(delay, int | float) or isinstance(delay, bool) or not 0 <= delay < float("inf"):
            raise InternalError(f"process_api_error returned delay_ms {delay!r}; expected a number >= 0")
        resp.retry_delay_ms = float(delay)
    elif result is not None:
        raise InternalError(
            f"process_api_error returned {type(result).__name__}; expected {{'retry': bool}} or None"
        )
    return resp


def execute_tool(result: Any, kwargs: Kwargs) -> ppb.ExecuteToolResponse:
    """The tool's result, any JSON value."""
    resp = ppb.ExecuteToolResponse()
    try:
        resp.result.CopyFrom(convert.to_value(result))
    except TypeError as exc:
        raise InternalError(f"execute_tool returned a non-JSON result: {exc}") from exc
    return resp
