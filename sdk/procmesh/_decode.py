"""Per-hook decoders: a request message -> the keyword arguments its hook may declare.

Each decoder returns only the hook's own arguments; the ones every hook gets (``state``,
``options``, ``abort``, ...) come from the request's ``RunContext`` in the servicer, which
needs the hosted processor (its options model) and the call's effects. A decoder raises
``ValueError``/``TypeError``/``KeyError`` (or a protobuf JSON error) on a malformed request:
the servicer answers INVALID_ARGUMENT.
"""

from __future__ import annotations

from typing import Any

from procmesh import convert
from procmesh._message_list import MessageList
from procmesh.v1 import processor_pb2 as ppb

Kwargs = dict[str, Any]


def _messages(field: Any) -> list[dict[str, Any]]:
    # A part of a kind this SDK does not know (a newer orchestrator's) passes through untouched.
    return [convert.message_from_proto(m, keep_unknown=True) for m in field]


def _steps(field: Any) -> list[dict[str, Any]]:
    return [convert.step_from_proto(s) for s in field]


def _tool(tool: Any) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": convert.from_struct(tool.input_schema),
    }


def process_input(req: ppb.ProcessInputRequest) -> Kwargs:
    """``messages`` (this turn's), ``message_list`` (the whole list, editable), ``system_messages``."""
    # message_list is built first, as before the table existed: a malformed all_messages
    # is reported before a malformed messages field.
    message_list = MessageList(_messages(req.all_messages), req.context.message_sources)
    return {
        "messages": _messages(req.messages),
        "message_list": message_list,
        "system_messages": _messages(req.system_messages),
    }


def process_input_step(req: ppb.ProcessInputStepRequest) -> Kwargs:
    """The step's messages, model, tools and settings; ``tool_choice`` as the seeds spell it."""
    messages = _messages(req.messages)
    tool_choice: Any = req.tool_choice.mode or None
    if req.tool_choice.mode == "tool":
        tool_choice = {"type": "tool", "toolName": req.tool_choice.tool_name}
    return {
        "messages": messages,
        "message_list": MessageList(messages, req.context.message_sources),
        "system_messages": _messages(req.system_messages),
        "model": req.model,
        "tools": [_tool(t) for t in req.tools],
        "tool_choice": tool_choice,
        "active_tools": list(req.active_tools),
        "provider_options": convert.from_struct(req.provider_options),
        "model_settings": convert.from_struct(req.model_settings),
        "steps": _steps(req.steps),
    }


def process_llm_request(req: ppb.ProcessLLMRequestRequest) -> Kwargs:
    """The prompt about to be sent, the model and the steps so far."""
    return {
        "prompt": convert.prompt_from_proto(req.prompt),
        "model": req.model,
        "model_spec_version": req.model_spec_version,
        "steps": _steps(req.steps),
    }


def process_llm_response(req: ppb.ProcessLLMResponseRequest) -> Kwargs:
    """The model's chunks for the step (or the cached response's)."""
    return {
        "chunks": [convert.chunk_from_proto(c) for c in req.chunks],
        "model": req.model,
        "steps": _steps(req.steps),
        "from_cache": req.from_cache,
    }


def process_output_stream(item: ppb.StreamPart) -> Kwargs:
    """One streamed part (the stream handler adds ``stream_parts``, the parts so far)."""
    return {"part": convert.chunk_from_proto(item.part)}


def process_output_step(req: ppb.ProcessOutputStepRequest) -> Kwargs:
    """The finished step: messages, text, tool calls (None when there are none), usage."""
    messages = _messages(req.messages)
    return {
        "messages": messages,
        "message_list": MessageList(messages, req.context.message_sources),
        "system_messages": _messages(req.system_messages),
        "text": req.text,
        "tool_calls": [
            {"toolCallId": c.tool_call_id, "toolName": c.tool_name, "args": convert.from_value(c.args)}
            for c in req.tool_calls
        ]
        or None,
        "finish_reason": req.finish_reason,
        "usage": convert.usage_from_proto(req.usage),
        "steps": _steps(req.steps),
    }


def process_tool_result(req: ppb.ProcessToolResultRequest) -> Kwargs:
    """One tool call's result, with its name, call id and arguments."""
    return {
        "messages": _messages(req.messages),
        "tool_name": req.tool_name,
        "tool_call_id": req.tool_call_id,
        "args": convert.from_value(req.args),
        "result": convert.from_value(req.result),
        "provider_executed": req.provider_executed,
        "steps": _steps(req.steps),
    }


def process_output_result(req: ppb.ProcessOutputResultRequest) -> Kwargs:
    """The run's result (text, usage, finishReason, steps) and its messages."""
    messages = _messages(req.messages)
    res = req.result
    return {
        "messages": messages,
        "message_list": MessageList(messages, req.context.message_sources),
        "result": {
            "text": res.text,
            "usage": convert.usage_from_proto(res.usage),
            "finishReason": res.finish_reason,
            "steps": _steps(res.steps),
        },
    }


def process_api_error(req: ppb.ProcessAPIErrorRequest) -> Kwargs:
    """The provider's error, the messages and the steps so far."""
    messages = _messages(req.messages)
    err = req.error
    return {
        "error": {
            "status": err.status,
            "message": err.message,
            "body": err.body,
            "retryable": err.retryable,
            "id": err.id or None,
            "details": convert.from_struct(err.details),
        },
        "messages": messages,
        "message_list": MessageList(messages, req.context.message_sources),
        "steps": _steps(req.steps),
    }


def execute_tool(req: ppb.ExecuteToolRequest) -> Kwargs:
    """A tool call the processor runs itself."""
    return {
        "tool_name": req.tool_name,
        "tool_call_id": req.tool_call_id,
        "args": convert.from_value(req.args),
        "messages": _messages(req.messages),
    }
