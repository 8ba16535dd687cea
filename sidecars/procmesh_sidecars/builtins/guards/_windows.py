"""Judging windows of a streamed answer: where a window ends, and the parts held behind it.

Pure bookkeeping (no I/O, no model): a guard judges a streamed answer per window, never per
chunk. A window is the text of consecutive ``text-delta`` parts, closed at a sentence's end or
once it holds `window_size` characters, whichever comes first (``window_boundary: chars`` closes
on size only); a non-text part or the step's end closes it too. Windows are cut between deltas,
never inside one. A guard that must judge text
before the client sees it (block, filter, redact, rewrite) holds the window's parts back; every
part arriving behind a held window is held too, so the client's order is kept.

Everything lives in the processor's run ``state`` (JSON), so the SDK's speculative rewind,
which puts the state back, puts the windows back as well. The shape, under ``state["windows"]``:
``[{"id", "text", "parts": [chunk, ...], "closed": bool}, ...]``, oldest first; only the last
may be open. Windows are numbered in the state too (``state["window_seq"]``), so a window the
rewind replays gets the id it had, and the guard finds the verdict it asked for (no second call).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field

Chunk = dict[str, Any]
Window = dict[str, Any]

_CLOSERS = "[\"'\u201d\u2019)\\]]*"
"""Closing quotes or brackets that may follow a sentence's final punctuation."""
_WIDE_STOP = re.compile(f"[\u3002\uff01\uff1f]{_CLOSERS}\\s*$")
"""The CJK full stop, exclamation and question marks: nothing follows them but the next sentence."""
_STOP = re.compile(f"[.!?\u2026]{_CLOSERS}$")
_STOP_SPACE = re.compile(f"[.!?\u2026]{_CLOSERS}\\s+$")
"""``.``, ``!``, ``?`` and ``…`` end a sentence only when whitespace follows: streamed tokens cut
``jane@example.com`` or ``3.14`` anywhere, and a window closed inside one would judge half of it."""

STEP_ENDS = ("step-finish", "finish")
"""A step's end: every window is judged and everything held is let go before it."""


class WindowOptions(BaseModel):
    """How a streamed answer is cut into judged windows (shared by the guards that stream)."""

    window_size: int = Field(default=200, ge=1)
    """Characters after which a window closes even mid-sentence (the reference's PII
    ``bufferSize``, 200)."""
    window_boundary: Literal["sentence", "chars"] = "sentence"
    """``sentence``: a window also closes where a sentence ends; ``chars``: on size only."""


def ends_window(text: str, options: WindowOptions) -> bool:
    """Whether a window holding `text` is complete whatever comes next (its size, or a sentence end)."""
    if len(text) >= options.window_size:
        return True
    if options.window_boundary != "sentence" or not text.strip():
        return False
    return bool(_WIDE_STOP.search(text) or _STOP_SPACE.search(text))


def ends_before(text: str, following: str, options: WindowOptions) -> bool:
    """Whether a window holding `text` ended a sentence that `following` (the next delta) does not go on."""
    return options.window_boundary == "sentence" and bool(_STOP.search(text)) and following[:1].isspace()


def windows(state: dict[str, Any]) -> list[Window]:
    """The run's held windows, oldest first (created empty)."""
    held: list[Window] = state.setdefault("windows", [])
    return held


def _new_window(state: dict[str, Any]) -> Window:
    number = int(state.get("window_seq", 0))
    state["window_seq"] = number + 1
    return {"id": str(number), "text": "", "parts": [], "closed": False}


def add_text(state: dict[str, Any], part: Chunk, options: WindowOptions, *, hold: bool) -> list[Window]:
    """Add a text delta to the open window; the windows this delta closed (oldest first).

    A sentence whose final stop ends a delta closes when the next delta starts with whitespace
    (the window before that delta); a window reaching `window_size` closes with its last delta.
    With `hold`, the part is kept in its window (and leaves with its verdict); without, the
    caller lets it go at once and the window keeps only its text.
    """
    held = windows(state)
    text = str((part.get("payload") or {}).get("text", ""))
    closed: list[Window] = []
    if held and not held[-1]["closed"] and ends_before(held[-1]["text"], text, options):
        held[-1]["closed"] = True
        closed.append(held[-1])
    if not held or held[-1]["closed"]:
        held.append(_new_window(state))
    window = held[-1]
    window["text"] += text
    if hold:
        window["parts"].append(part)
    if ends_window(window["text"], options):
        window["closed"] = True
        closed.append(window)
    return closed


def close_open(state: dict[str, Any]) -> Window | None:
    """Close the open window (a non-text part or the step's end came); the window if it had text.

    An open window without text (only parts held behind an earlier one) closes too: nothing
    is left to judge in it, and its parts leave in turn.
    """
    held = windows(state)
    if not held or held[-1]["closed"]:
        return None
    window = held[-1]
    window["closed"] = True
    return window if window["text"] else None


def hold_behind(state: dict[str, Any], part: Chunk) -> bool:
    """Keep a non-text part behind the held windows; False when nothing is held (it may go now)."""
    held = windows(state)
    if not any(w["parts"] for w in held):
        return False
    close_open(state)
    held[-1]["parts"].append(part)
    return True


def pop_head(state: dict[str, Any]) -> Window | None:
    """Remove and return the oldest window if it is closed (its verdict decides its parts)."""
    held = windows(state)
    if held and held[0]["closed"]:
        return held.pop(0)
    return None


def head(state: dict[str, Any]) -> Window | None:
    """The oldest closed window, not removed."""
    held = windows(state)
    return held[0] if held and held[0]["closed"] else None


def text_parts(window: Window) -> list[Chunk]:
    """The window's held text deltas."""
    return [p for p in window["parts"] if p.get("type") == "text-delta"]


def other_parts(window: Window) -> list[Chunk]:
    """The parts held behind the window's text (tool calls, reasoning, ...), in order."""
    return [p for p in window["parts"] if p.get("type") != "text-delta"]


def replaced(window: Window, text: str) -> list[Chunk]:
    """The window's parts with its text replaced by `text` (one delta, the first one's id)."""
    deltas = text_parts(window)
    out: list[Chunk] = []
    if text and deltas:
        first = deltas[0]
        payload = {**(first.get("payload") or {}), "text": text}
        out.append({**first, "payload": payload})
    return out + other_parts(window)
