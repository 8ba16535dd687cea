"""Signals, provider prompts and step results <-> their ``procmesh.v1`` messages.

These are the per-turn records around the messages and chunks: what a processor
signals, what the model is sent, and what one step produced.
"""

from __future__ import annotations

from typing import Any

from procmesh._convert.chunks import abort_from_proto, abort_to_proto, usage_from_proto, usage_to_proto
from procmesh._convert.values import fill_struct, from_struct, from_value, to_value
from procmesh.v1 import types_pb2 as pb


def signal_to_proto(signal: dict[str, Any], out: pb.Signal | None = None) -> pb.Signal:
    """Convert a ``send_signal`` dict to ``procmesh.v1.Signal``."""
    out = out if out is not None else pb.Signal()
    out.type = signal.get("type", "reactive")
    contents = signal.get("contents", "")
    if not isinstance(contents, str):
        raise ValueError("signal contents must be a string")
    out.contents = contents
    out.tag_name = signal.get("tagName", "") or ""
    for name, value in (signal.get("attributes") or {}).items():
        attr = out.attributes.add()
        attr.name = str(name)
        attr.value.CopyFrom(to_value(value))
    out.transient = bool(signal.get("transient", False))
    if signal.get("metadata"):
        fill_struct(out.metadata, signal["metadata"])
    out.id = signal.get("id", "") or ""
    return out


def signal_from_proto(signal: pb.Signal) -> dict[str, Any]:
    """Convert ``procmesh.v1.Signal`` to a signal dict (keys as given to ``send_signal``)."""
    out: dict[str, Any] = {"type": signal.type or "reactive", "contents": signal.contents}
    if signal.tag_name:
        out["tagName"] = signal.tag_name
    if signal.attributes:
        out["attributes"] = {a.name: from_value(a.value) for a in signal.attributes}
    if signal.transient:
        out["transient"] = True
    if signal.metadata.fields:
        out["metadata"] = from_struct(signal.metadata)
    if signal.id:
        out["id"] = signal.id
    return out


def prompt_to_proto(prompt: list[dict[str, Any]], out: Any) -> None:
    """Append provider-shaped prompt messages to a repeated ``PromptMessage`` field.

    A prompt message is ``{"role": "system", "content": "text"}`` or
    ``{"role": ..., "content": [parts]}`` with parts ``{"type": "text", "text"}``,
    ``{"type": "tool-call", "toolCallId", "toolName", "input"}``,
    ``{"type": "tool-result", "toolCallId", "toolName", "output"}``,
    ``{"type": "file", "mediaType", "data"}`` and ``{"type": "reasoning", "text"}``.
    """
    for msg in prompt:
        pm = out.add()
        pm.role = msg["role"]
        content = msg.get("content")
        if isinstance(content, str):
            part = pm.content.add()
            part.type = "text"
            part.text = content
            continue
        for src in content or []:
            part = pm.content.add()
            part.type = src["type"]
            part.text = src.get("text", "")
            part.tool_call_id = src.get("toolCallId", "")
            part.tool_name = src.get("toolName", "")
            if "input" in src:
                part.input.CopyFrom(to_value(src["input"]))
            if "output" in src:
                part.output.CopyFrom(to_value(src["output"]))
            part.media_type = src.get("mediaType", "")
            part.filename = src.get("filename", "")
            part.provider_executed = bool(src.get("providerExecuted"))
            part.provider = src.get("provider", "")
            part.signature = src.get("signature", "")
            data = src.get("data", "")
            if isinstance(data, bytes | bytearray):
                part.data = bytes(data)
            elif data:
                part.url = str(data)


def prompt_from_proto(prompt: Any) -> list[dict[str, Any]]:
    """Convert repeated ``PromptMessage`` to provider-shaped prompt dicts."""
    out: list[dict[str, Any]] = []
    for pm in prompt:
        if pm.role == "system":
            out.append({"role": "system", "content": "\n".join(p.text for p in pm.content)})
            continue
        parts: list[dict[str, Any]] = []
        for p in pm.content:
            part: dict[str, Any] = {"type": p.type}
            if p.type in ("text", "reasoning"):
                part["text"] = p.text
            elif p.type == "tool-call":
                part.update(toolCallId=p.tool_call_id, toolName=p.tool_name, input=from_value(p.input))
            elif p.type == "tool-result":
                part.update(toolCallId=p.tool_call_id, toolName=p.tool_name, output=from_value(p.output))
            elif p.type == "file":
                part.update(mediaType=p.media_type, data=p.data if p.data else p.url)
                if p.filename:
                    part["filename"] = p.filename
            if p.provider:
                part["provider"] = p.provider
            if p.provider_executed:
                part["providerExecuted"] = True
            if p.signature:
                part["signature"] = p.signature
            parts.append(part)
        out.append({"role": pm.role, "content": parts})
    return out


def step_to_proto(step: dict[str, Any], out: pb.StepResult) -> None:
    """Fill ``procmesh.v1.StepResult`` from a step dict."""
    out.step_number = int(step.get("stepNumber", 0))
    out.text = step.get("text", "")
    for call in step.get("toolCalls") or []:
        tc = out.tool_calls.add()
        tc.tool_call_id = call.get("toolCallId", "")
        tc.tool_name = call.get("toolName", "")
        tc.args.CopyFrom(to_value(call.get("args")))
    for res in step.get("toolResults") or []:
        tr = out.tool_results.add()
        tr.tool_call_id = res.get("toolCallId", "")
        tr.tool_name = res.get("toolName", "")
        tr.args.CopyFrom(to_value(res.get("args")))
        tr.result.CopyFrom(to_value(res.get("result")))
    out.finish_reason = step.get("finishReason", "")
    usage_to_proto(step.get("usage"), out.usage)
    if step.get("tripwire"):
        abort_to_proto(step["tripwire"], out.tripwire)


def step_from_proto(step: pb.StepResult) -> dict[str, Any]:
    """Convert ``procmesh.v1.StepResult`` to a step dict."""
    return {
        "stepNumber": step.step_number,
        "text": step.text,
        "toolCalls": [
            {"toolCallId": c.tool_call_id, "toolName": c.tool_name, "args": from_value(c.args)}
            for c in step.tool_calls
        ],
        "toolResults": [
            {
                "toolCallId": r.tool_call_id,
                "toolName": r.tool_name,
                "args": from_value(r.args),
                "result": from_value(r.result),
            }
            for r in step.tool_results
        ],
        "finishReason": step.finish_reason,
        "usage": usage_from_proto(step.usage),
        "tripwire": abort_from_proto(step.tripwire) if step.HasField("tripwire") else None,
    }
