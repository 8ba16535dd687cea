"""MastraDBMessage dicts <-> ``procmesh.v1.Message`` (with its parts)."""

from __future__ import annotations

import base64
from typing import Any

from procmesh._convert.values import fill_struct, from_struct, from_value, to_value
from procmesh.parts import flat_text, part_provenance, with_flat_text
from procmesh.v1 import types_pb2 as pb

Message = dict[str, Any]

UNKNOWN_PART = "procmesh-unknown"
"""The type of a part whose kind this code does not know (a newer orchestrator's, or none):
``{"type": "procmesh-unknown", "proto": <the Part's bytes, base64>}``. A sidecar shows it to hooks
as that and, returned, sends the bytes back as they came (proto/README.md, forward compatibility)."""


def _part_to_proto(part: dict[str, Any], out: pb.Part) -> None:
    kind = part.get("type")
    if kind == "text":
        out.text.text = part.get("text", "")
    elif kind == "reasoning":
        out.reasoning.text = part.get("text", "")
        origin = part_provenance(part)
        out.reasoning.signature = origin.get("signature", "")
        out.reasoning.provider = origin.get("provider", "")
    elif kind == "tool-invocation":
        inv = part.get("toolInvocation", {})
        ti = out.tool_invocation
        origin = part_provenance(part, inv)
        ti.provider_executed = bool(origin.get("providerExecuted"))
        ti.provider = origin.get("provider", "")
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
    elif kind == UNKNOWN_PART:
        out.MergeFromString(base64.b64decode(part.get("proto", ""), validate=True))
    else:
        raise ValueError(f"unsupported message part type {kind!r}")


def _part_from_proto(part: pb.Part, keep_unknown: bool) -> dict[str, Any]:
    kind = part.WhichOneof("kind")
    if kind == "text":
        return {"type": "text", "text": part.text.text}
    if kind == "reasoning":
        reasoning: dict[str, Any] = {"type": "reasoning", "text": part.reasoning.text}
        if part.reasoning.provider:
            reasoning["provider"] = part.reasoning.provider
        if part.reasoning.signature:
            reasoning["signature"] = part.reasoning.signature
        return reasoning
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
        invocation: dict[str, Any] = {"type": "tool-invocation", "toolInvocation": inv}
        if ti.provider:
            invocation["provider"] = ti.provider
        if ti.provider_executed:
            invocation["providerExecuted"] = True
        return invocation
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
    if keep_unknown:
        return {"type": UNKNOWN_PART, "proto": base64.b64encode(part.SerializeToString()).decode()}
    raise ValueError("message part has no kind set")


class Content(dict[str, Any]):
    """A decoded message's content: a plain dict, except that ``["content"]`` (and
    ``.get("content")``) also reads the legacy flattened text (the text parts joined with
    newlines) when the dict has no such key, as the seeds' fallback says. It is not a key: equal to
    the plain dict, and not in its JSON."""

    def __missing__(self, key: str) -> Any:
        flat = flat_text(self.get("parts") or []) if key == "content" else ""
        if not flat:
            raise KeyError(key)
        return flat

    def get(self, key: str, default: Any = None) -> Any:
        """`dict.get`, with the flattened text for ``"content"``."""
        try:
            return self[key]
        except KeyError:
            return default


def message_to_proto(msg: Message, out: pb.Message | None = None) -> pb.Message:
    """Convert a MastraDBMessage dict to ``procmesh.v1.Message``."""
    out = out if out is not None else pb.Message()
    out.id = msg.get("id", "")
    out.role = msg.get("role", "")
    content = msg.get("content") or {}
    if isinstance(content, str):
        content = {"parts": [{"type": "text", "text": content}]}
    out.content.format = 2
    for part in with_flat_text(content):
        _part_to_proto(part, out.content.parts.add())
    if content.get("metadata"):
        fill_struct(out.content.metadata, content["metadata"])
    out.created_at = msg.get("createdAt", "")
    out.thread_id = msg.get("threadId", "") or ""
    out.resource_id = msg.get("resourceId", "") or ""
    out.type = msg.get("type", "") or ""
    return out


def message_from_proto(msg: pb.Message, *, keep_unknown: bool = False) -> Message:
    """Convert ``procmesh.v1.Message`` to a MastraDBMessage dict.

    A part of a kind this code does not know (none set, or a newer contract's) is a ValueError,
    unless `keep_unknown`: then it becomes an `UNKNOWN_PART` that carries its bytes (what a
    sidecar does: it passes a newer orchestrator's parts through untouched, never refuses them).
    """
    content: dict[str, Any] = {
        "format": 2,
        "parts": [_part_from_proto(p, keep_unknown) for p in msg.content.parts],
    }
    if msg.content.HasField("metadata") and msg.content.metadata.fields:
        content["metadata"] = from_struct(msg.content.metadata)
    out: Message = {"id": msg.id, "role": msg.role, "content": Content(content)}
    if msg.created_at:
        out["createdAt"] = msg.created_at
    if msg.thread_id:
        out["threadId"] = msg.thread_id
    if msg.resource_id:
        out["resourceId"] = msg.resource_id
    if msg.type:
        out["type"] = msg.type
    return out
