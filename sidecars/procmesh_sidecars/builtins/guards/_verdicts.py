"""A guard's verdict about one text, and applying it: to an input message (kept, dropped, its
text replaced or metadata added) or to a window of the streamed answer (its parts let go, dropped
or replaced). A ``block`` aborts through the hook's `abort`; every other action but ``pass``
reports its message as a violation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from procmesh_sidecars.builtins._common import Chunk, Message
from procmesh_sidecars.builtins.guards import _windows

Action = Literal["pass", "warn", "block", "drop", "replace"]


@dataclass(frozen=True)
class Verdict:
    """What a guard decided about one text (a message's or a window's).

    ``pass`` leaves it; ``warn`` leaves it and reports a violation; ``block`` aborts (the abort
    reaches onViolation); ``drop`` removes it; ``replace`` puts `text` in its place. Every action
    but ``pass`` reports `message` with `detail` as a violation, unless `message` is empty (a
    translation is no violation).
    """

    action: Action
    message: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    text: str | None = None
    """The replacement (``replace`` only)."""
    metadata: dict[str, Any] | None = None
    """Merged into an input message's ``content.metadata`` (language detection)."""


PASS = Verdict("pass")


def with_text(message: Message, text: str) -> Message:
    """`message` with its text parts replaced by one part holding `text` (other parts are kept)."""
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": text}
    content = dict(content or {})
    parts = list(content.get("parts") or [])
    first = next((i for i, p in enumerate(parts) if p.get("type") == "text"), None)
    others = [p for p in parts if p.get("type") != "text"]
    text_part = {"type": "text", "text": text}
    if first is None:
        content["parts"] = [text_part, *others]
    else:
        kept = [p for i, p in enumerate(parts) if p.get("type") != "text" or i == first]
        content["parts"] = [text_part if p.get("type") == "text" else p for p in kept]
    if isinstance(content.get("content"), str):
        content["content"] = text
    return {**message, "content": content}


def with_metadata(message: Message, metadata: dict[str, Any]) -> Message:
    """`message` with `metadata` merged into its ``content.metadata``."""
    content = message.get("content")
    if not isinstance(content, dict):
        return message
    merged = {**(content.get("metadata") or {}), **metadata}
    return {**message, "content": {**content, "metadata": merged}}


def apply_to_message(message: Message, verdict: Verdict, abort: Any, report: Any) -> Message | None:
    if verdict.action == "block":
        abort(verdict.message, metadata=verdict.detail)
    if verdict.action != "pass" and verdict.message:
        report(verdict.message, verdict.detail)
    if verdict.action == "drop":
        return None
    result = message
    if verdict.action == "replace" and verdict.text is not None:
        result = with_text(result, verdict.text)
    if verdict.metadata:
        result = with_metadata(result, verdict.metadata)
    return result


def apply_to_window(window: _windows.Window, verdict: Verdict, abort: Any, report: Any) -> list[Chunk]:
    if verdict.action == "block":
        abort(verdict.message, metadata=verdict.detail)
    if verdict.action == "pass":
        return list(window["parts"])
    if verdict.message:
        report(verdict.message, verdict.detail)
    if verdict.action == "drop":
        return _windows.other_parts(window)
    if verdict.action == "replace" and verdict.text is not None:
        return _windows.replaced(window, verdict.text)
    return list(window["parts"])
