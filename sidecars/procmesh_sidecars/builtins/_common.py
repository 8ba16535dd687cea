"""Helpers the built-in processors share: message text, JS-compatible JSON, prompt walking."""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

Message = dict[str, Any]
Chunk = dict[str, Any]
PromptMessage = dict[str, Any]

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _js_string(text: str) -> str:
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def js_number(value: float) -> str:
    """A number as JavaScript's ``String(n)`` writes it (``1.0`` is ``1``, ``1e21`` is ``1e+21``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if abs(value) < 10**21:
            return str(value)
        value = float(value)
    if math.isnan(value) or math.isinf(value):
        return "null"  # JSON.stringify writes null for NaN and the infinities
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    # Shortest round-trip digits (repr), then ECMAScript's Number::toString layout rules.
    parsed = Decimal(repr(abs(value))).normalize().as_tuple()
    digits = "".join(map(str, parsed.digits))
    k = len(digits)
    n = k + int(parsed.exponent)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    exp = n - 1
    exp_str = f"e+{exp}" if exp >= 0 else f"e-{-exp}"
    return sign + digits[0] + ("." + digits[1:] if k > 1 else "") + exp_str


def js_stringify(value: Any, *, sort_keys: bool = False) -> str:
    """``JSON.stringify(value)``: no spaces, JS number formatting, non-ASCII kept as is.

    With `sort_keys`, object keys are sorted at every level (a stable stringify).
    """
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int | float):
        return js_number(value)
    if isinstance(value, str):
        return _js_string(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(js_stringify(v, sort_keys=sort_keys) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: str(k).encode("utf-16-be")) if sort_keys else list(value)
        return (
            "{"
            + ",".join(_js_string(str(k)) + ":" + js_stringify(value[k], sort_keys=sort_keys) for k in keys)
            + "}"
        )
    return _js_string(str(value))


def message_text(msg: Message) -> str:
    """The text parts of a MastraDBMessage joined with newlines (falls back to ``content.content``)."""
    content = msg.get("content")
    if isinstance(content, str):
        return content
    content = content or {}
    parts = content.get("parts") or []
    texts = [p.get("text", "") for p in parts if p.get("type") == "text" and p.get("text")]
    if texts:
        return "\n".join(texts)
    return str(content.get("content") or "")


def map_message_text(msg: Message, fn: Callable[[str], str]) -> Message:
    """A copy of `msg` with `fn` applied to every text part (and a string ``content.content``)."""
    content = msg.get("content")
    if isinstance(content, str):
        return {**msg, "content": fn(content)}
    content = dict(content or {})
    if isinstance(content.get("parts"), list):
        content["parts"] = [
            {**p, "text": fn(p["text"])} if p.get("type") == "text" and isinstance(p.get("text"), str) else p
            for p in content["parts"]
        ]
    if isinstance(content.get("content"), str):
        content["content"] = fn(content["content"])
    return {**msg, "content": content}


def prompt_parts(msg: PromptMessage) -> list[dict[str, Any]]:
    """A provider prompt message's parts (a system message's string becomes one text part)."""
    content = msg.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content or [])
