"""Stream chunk dicts (``{"type", "payload"}``) <-> ``procmesh.v1.Chunk``, with usage and abort.

Usage and abort live here rather than with the step mapping because a chunk
(``finish``, ``tripwire``) is where they first appear; `procmesh._convert.turns`
reuses them for step results.
"""

from __future__ import annotations

from typing import Any

from procmesh._convert.values import fill_struct, from_struct, from_value, to_value
from procmesh.v1 import types_pb2 as pb

Chunk = dict[str, Any]


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
        if "requestContext" in payload:  # a client tool's call, as the orchestrator streams it
            tc.request_context.SetInParent()  # present even when empty
            fill_struct(tc.request_context, payload["requestContext"])
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
            fill_struct(fin.metadata, payload["metadata"])
    elif kind == "tripwire":
        abort_to_proto(payload, out.tripwire)
    elif kind == "error":
        out.error.message = str(payload.get("message", payload.get("error", "")))
    else:
        fill_struct(out.other, payload)
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
        if tc.HasField("request_context"):
            payload["requestContext"] = from_struct(tc.request_context)
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
