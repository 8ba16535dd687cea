"""Conversion between the wire types (`procmesh.v1`) and the plain dicts hooks see.

Hooks work on JSON-shaped dicts that mirror the reference engine:
messages are MastraDBMessage dicts (``{"id", "role", "content": {"format": 2,
"parts": [...], "metadata": {...}}, ...}``) and chunks are ``{"type", "payload"}``
dicts (``{"type": "text-delta", "payload": {"text": "..."}}``; data chunks are
``{"type": "data-x", "data": ...}``). The orchestrator and the SDK convert at
the gRPC boundary with the functions here, so both sides agree on one mapping.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2

from procmesh.v1 import types_pb2 as pb

JSON = Any
Message = dict[str, Any]
Chunk = dict[str, Any]

__all__ = [
    "abort_from_proto",
    "abort_to_proto",
    "chunk_from_proto",
    "chunk_to_proto",
    "from_struct",
    "from_value",
    "message_from_proto",
    "message_to_proto",
    "prompt_from_proto",
    "prompt_to_proto",
    "signal_from_proto",
    "signal_to_proto",
    "step_from_proto",
    "step_to_proto",
    "to_struct",
    "to_value",
    "usage_from_proto",
    "usage_to_proto",
]


# -- JSON values ---------------------------------------------------------------


def to_value(obj: JSON) -> struct_pb2.Value:
    """Convert a JSON-compatible Python value to ``google.protobuf.Value``."""
    value = struct_pb2.Value()
    _fill_value(value, obj)
    return value


def _fill_value(value: struct_pb2.Value, obj: JSON) -> None:
    if obj is None:
        value.null_value = struct_pb2.NULL_VALUE
    elif isinstance(obj, bool):
        value.bool_value = obj
    elif isinstance(obj, int | float):
        value.number_value = obj
    elif isinstance(obj, str):
        value.string_value = obj
    elif isinstance(obj, dict):
        # SetInParent: an empty {} or [] must still select its kind, or it reads back as null.
        value.struct_value.SetInParent()
        _fill_struct(value.struct_value, obj)
    elif isinstance(obj, list | tuple):
        lst = value.list_value
        lst.SetInParent()
        for item in obj:
            _fill_value(lst.values.add(), item)
    else:
        raise TypeError(f"value of type {type(obj).__name__} is not JSON-serializable")


def _fill_struct(struct: struct_pb2.Struct, obj: dict[str, Any]) -> None:
    for key, item in obj.items():
        if not isinstance(key, str):
            raise TypeError(f"JSON object keys must be strings, got {type(key).__name__}")
        _fill_value(struct.fields[key], item)


def to_struct(obj: dict[str, Any] | None) -> struct_pb2.Struct:
    """Convert a dict to ``google.protobuf.Struct`` (None gives an empty Struct)."""
    struct = struct_pb2.Struct()
    if obj:
        _fill_struct(struct, obj)
    return struct


def from_value(value: struct_pb2.Value) -> JSON:
    """Convert ``google.protobuf.Value`` to Python; integral numbers become ints (as in JSON)."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        num = value.number_value
        return int(num) if num.is_integer() and abs(num) < 2**53 else num
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return from_struct(value.struct_value)
    if kind == "list_value":
        return [from_value(v) for v in value.list_value.values]
    return None


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """Convert ``google.protobuf.Struct`` to a dict."""
    return {key: from_value(val) for key, val in struct.fields.items()}


# -- messages -------------------------------------------------------------------


def _part_to_proto(part: dict[str, Any], out: pb.Part) -> None:
    kind = part.get("type")
    if kind == "text":
        out.text.text = part.get("text", "")
    elif kind == "reasoning":
        out.reasoning.text = part.get("text", "")
    elif kind == "tool-invocation":
        inv = part.get("toolInvocation", {})
        ti = out.tool_invocation
        ti.state = inv.get("state", "call")
        ti.tool_call_id = inv.get("toolCallId", "")
        ti.tool_name = inv.get("toolName", "")
        ti.args.CopyFrom(to_value(inv.get("args")))
        if "result" in inv:
            ti.result.CopyFrom(to_value(inv["result"]))
        ti.error_text = inv.get("errorText", "")
    elif kind in ("file", "image"):
        fp = out.file
        fp.media_type = part.get("mediaType", part.get("mimeType", ""))
        data = part.get("data", part.get("url", ""))
        if isinstance(data, bytes | bytearray):
            fp.data = bytes(data)
        else:
            fp.url = str(data or "")
        fp.filename = part.get("filename", "")
    elif kind == "step-start":
        out.step_start.SetInParent()
    elif isinstance(kind, str) and kind.startswith("data-"):
        out.data.type = kind
        out.data.data.CopyFrom(to_value(part.get("data")))
    else:
        raise ValueError(f"unsupported message part type {kind!r}")


def _part_from_proto(part: pb.Part) -> dict[str, Any]:
    kind = part.WhichOneof("kind")
    if kind == "text":
        return {"type": "text", "text": part.text.text}
    if kind == "reasoning":
        return {"type": "reasoning", "text": part.reasoning.text}
    if kind == "tool_invocation":
        ti = part.tool_invocation
        inv: dict[str, Any] = {
            "state": ti.state,
            "toolCallId": ti.tool_call_id,
            "toolName": ti.tool_name,
            "args": from_value(ti.args),
        }
        if ti.HasField("result"):
            inv["result"] = from_value(ti.result)
        if ti.error_text:
            inv["errorText"] = ti.error_text
        return {"type": "tool-invocation", "toolInvocation": inv}
    if kind == "file":
        fp = part.file
        out: dict[str, Any] = {"type": "file", "mediaType": fp.media_type}
        out["data"] = fp.data if fp.data else fp.url
        if fp.filename:
            out["filename"] = fp.filename
        return out
    if kind == "data":
        return {"type": part.data.type, "data": from_value(part.data.data)}
    if kind == "step_start":
        return {"type": "step-start"}
    raise ValueError("message part has no kind set")


def message_to_proto(msg: Message, out: pb.Message | None = None) -> pb.Message:
    """Convert a MastraDBMessage dict to ``procmesh.v1.Message``."""
    out = out if out is not None else pb.Message()
    out.id = msg.get("id", "")
    out.role = msg.get("role", "")
    content = msg.get("content") or {}
    if isinstance(content, str):
        content = {"parts": [{"type": "text", "text": content}]}
    out.content.format = 2
    for part in content.get("parts") or []:
        _part_to_proto(part, out.content.parts.add())
    if content.get("metadata"):
        _fill_struct(out.content.metadata, content["metadata"])
    out.created_at = msg.get("createdAt", "")
    out.thread_id = msg.get("threadId", "") or ""
    out.resource_id = msg.get("resourceId", "") or ""
    out.type = msg.get("type", "") or ""
    return out


def message_from_proto(msg: pb.Message) -> Message:
    """Convert ``procmesh.v1.Message`` to a MastraDBMessage dict."""
    content: dict[str, Any] = {
        "format": 2,
        "parts": [_part_from_proto(p) for p in msg.content.parts],
    }
    if msg.content.HasField("metadata") and msg.content.metadata.fields:
        content["metadata"] = from_struct(msg.content.metadata)
    out: Message = {"id": msg.id, "role": msg.role, "content": content}
    if msg.created_at:
        out["createdAt"] = msg.created_at
    if msg.thread_id:
        out["threadId"] = msg.thread_id
    if msg.resource_id:
        out["resourceId"] = msg.resource_id
    if msg.type:
        out["type"] = msg.type
    return out


# -- chunks ---------------------------------------------------------------------


def usage_to_proto(usage: dict[str, Any] | None, out: pb.Usage) -> None:
    """Fill ``procmesh.v1.Usage`` from ``{"inputTokens", "outputTokens", "totalTokens"}``."""
    usage = usage or {}
    out.input_tokens = int(usage.get("inputTokens") or 0)
    out.output_tokens = int(usage.get("outputTokens") or 0)
    out.total_tokens = int(usage.get("totalTokens") or (out.input_tokens + out.output_tokens))


def usage_from_proto(usage: pb.Usage) -> dict[str, int]:
    """Convert ``procmesh.v1.Usage`` to a usage dict."""
    return {
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "totalTokens": usage.total_tokens,
    }


def abort_to_proto(abort: dict[str, Any], out: pb.Abort) -> None:
    """Fill ``procmesh.v1.Abort`` from ``{"reason", "retry", "metadata", "processorId"}``."""
    out.reason = abort.get("reason", "")
    out.retry = bool(abort.get("retry", False))
    if abort.get("metadata") is not None:
        out.metadata.CopyFrom(to_value(abort["metadata"]))
    out.processor_id = abort.get("processorId", "") or ""


def abort_from_proto(abort: pb.Abort) -> dict[str, Any]:
    """Convert ``procmesh.v1.Abort`` to ``{"processorId", "reason", "retry", "metadata"}``."""
    return {
        "processorId": abort.processor_id,
        "reason": abort.reason,
        "retry": abort.retry,
        "metadata": from_value(abort.metadata) if abort.HasField("metadata") else None,
    }


def chunk_to_proto(chunk: Chunk, out: pb.Chunk | None = None) -> pb.Chunk:
    """Convert a chunk dict (``{"type", "payload"}``) to ``procmesh.v1.Chunk``."""
    out = out if out is not None else pb.Chunk()
    kind = chunk["type"]
    out.type = kind
    payload = chunk.get("payload") or {}
    if kind == "text-delta":
        out.text_delta.text = payload.get("text", "")
        out.text_delta.id = payload.get("id", "")
    elif kind.startswith("data-"):
        out.data.CopyFrom(to_value(chunk.get("data")))
        out.transient = bool(chunk.get("transient", False))
    elif kind == "tool-call":
        tc = out.tool_call
        tc.tool_call_id = payload.get("toolCallId", "")
        tc.tool_name = payload.get("toolName", "")
        tc.args.CopyFrom(to_value(payload.get("args")))
    elif kind == "tool-result":
        tr = out.tool_result
        tr.tool_call_id = payload.get("toolCallId", "")
        tr.tool_name = payload.get("toolName", "")
        tr.args.CopyFrom(to_value(payload.get("args")))
        tr.result.CopyFrom(to_value(payload.get("result")))
        tr.provider_executed = bool(payload.get("providerExecuted", False))
    elif kind == "finish":
        fin = out.finish
        fin.finish_reason = payload.get("finishReason", "")
        usage_to_proto(payload.get("usage"), fin.usage)
        if payload.get("metadata"):
            _fill_struct(fin.metadata, payload["metadata"])
    elif kind == "tripwire":
        abort_to_proto(payload, out.tripwire)
    elif kind == "error":
        out.error.message = str(payload.get("message", payload.get("error", "")))
    else:
        _fill_struct(out.other, payload)
    return out


def chunk_from_proto(chunk: pb.Chunk) -> Chunk:
    """Convert ``procmesh.v1.Chunk`` to a chunk dict."""
    kind = chunk.WhichOneof("payload")
    if kind == "text_delta":
        td = chunk.text_delta
        payload: dict[str, Any] = {"text": td.text}
        if td.id:
            payload["id"] = td.id
        return {"type": chunk.type, "payload": payload}
    if kind == "data":
        out: Chunk = {"type": chunk.type, "data": from_value(chunk.data)}
        if chunk.transient:
            out["transient"] = True
        return out
    if kind == "tool_call":
        tc = chunk.tool_call
        payload = {"toolCallId": tc.tool_call_id, "toolName": tc.tool_name, "args": from_value(tc.args)}
    elif kind == "tool_result":
        tr = chunk.tool_result
        payload = {
            "toolCallId": tr.tool_call_id,
            "toolName": tr.tool_name,
            "args": from_value(tr.args),
            "result": from_value(tr.result),
        }
        if tr.provider_executed:
            payload["providerExecuted"] = True
    elif kind == "finish":
        payload = {
            "finishReason": chunk.finish.finish_reason,
            "usage": usage_from_proto(chunk.finish.usage),
        }
        if chunk.finish.metadata.fields:
            payload["metadata"] = from_struct(chunk.finish.metadata)
    elif kind == "tripwire":
        payload = abort_from_proto(chunk.tripwire)
    elif kind == "error":
        payload = {"message": chunk.error.message}
    elif kind == "other":
        payload = from_struct(chunk.other)
    else:
        payload = {}
    if chunk.type.startswith("data-"):
        return {"type": chunk.type, "data": None}
    return {"type": chunk.type, "payload": payload}


# -- signals, prompts, steps ------------------------------------------------------


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
        _fill_struct(out.metadata, signal["metadata"])
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
