"""A run's response messages as the AI SDK v5 UI messages the reference returns in
``result.response.uiMessages`` (its ``AIV5Adapter.toUIMessage``): each message's ``metadata`` is its
``content.metadata`` (what a processOutputResult hook added, e.g.) with ``createdAt``, ``threadId``
and ``resourceId``; its parts are the UI parts (``text``, ``reasoning``, ``tool-<name>``, ``file``,
``data-*``, ``step-start``). A message whose only text is the legacy flattened ``content.content``
gets it as a text part, as the reference does.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def ui_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """`messages` (MastraDBMessage dicts) as AI SDK v5 UI messages, in order."""
    return [ui_message(m) for m in messages]


def ui_message(message: Message) -> dict[str, Any]:
    """One MastraDBMessage as an AI SDK v5 UI message."""
    content = message.get("content") or {}
    if isinstance(content, str):
        content = {"parts": [{"type": "text", "text": content}]}
    metadata = dict(content.get("metadata") or {})
    for key in ("createdAt", "threadId", "resourceId"):
        if message.get(key):
            metadata[key] = message[key]
    parts: list[dict[str, Any]] = []
    has_text = False
    for part in content.get("parts") or []:
        kind = str(part.get("type", ""))
        if kind == "tool-invocation":
            parts.append(_tool_part(part))
        elif kind == "reasoning":
            if part.get("text"):
                parts.append({"type": "reasoning", "text": part["text"], "state": "done"})
        elif kind == "file":
            parts.append(_file_part(part))
        else:  # text, data-*, step-start and what else a hook put there: as it is
            has_text = has_text or kind != "step-start"
            parts.append(dict(part))
    flat = content.get("content")
    if isinstance(flat, str) and flat and not has_text:
        parts.append({"type": "text", "text": flat})
    role = "system" if message.get("role") == "signal" else message.get("role")
    return {"id": message.get("id"), "role": role, "metadata": metadata, "parts": parts}


def _tool_part(part: dict[str, Any]) -> dict[str, Any]:
    inv = part.get("toolInvocation") or {}
    out: dict[str, Any] = {
        "type": f"tool-{inv.get('toolName', '')}",
        "toolCallId": inv.get("toolCallId"),
        "input": inv.get("args"),
    }
    state = inv.get("state")
    if state == "result":
        out.update(state="output-available", output=inv.get("result"))
    elif state == "output-error":
        out.update(state="output-error", errorText=inv.get("errorText", ""))
    else:
        out["state"] = "input-available"
    if part.get("providerMetadata"):  # a tool's model output (toModelOutput) is kept there
        out["callProviderMetadata"] = part["providerMetadata"]
    return out


def _file_part(part: dict[str, Any]) -> dict[str, Any]:
    data = part.get("data", part.get("url", ""))
    media = part.get("mediaType") or part.get("mimeType") or "application/octet-stream"
    if isinstance(data, str) and not data.startswith(("http://", "https://", "data:")):
        data = f"data:{media};base64,{data}"
    out = {"type": "file", "url": data, "mediaType": media}
    if part.get("filename"):
        out["filename"] = part["filename"]
    return out
