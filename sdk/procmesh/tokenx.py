"""The reference's token estimate: a port of ``tokenx`` 1.3.0, the version @mastra/core and
@mastra/memory 1.71 bundle (no tokenizer: a few rules per text segment).

The orchestrator's memory budget (``memory.messageHistory``) counts with it, as the reference's
memory does; it imports no wire, so the run loop may use it.
"""

from __future__ import annotations

import math
import re

_PUNCTUATION = r"[.,!?;(){}\[\]<>:/\\|@#$%^&*+=`~_-]"
_SPLIT = re.compile(rf"(\s+|{_PUNCTUATION}+)")
_PUNCT = re.compile(_PUNCTUATION)
_WHITESPACE = re.compile(r"^\s+$")
_CJK = re.compile(
    "[\u4e00-\u9fff\u3400-\u4dbf\u3000-\u303f\uff00-\uffef\u30a0-\u30ff\u2e80-\u2eff\u31c0-\u31ef"
    "\u3200-\u32ff\u3300-\u33ff\uac00-\ud7af\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\ud7b0-\ud7ff]"
)
_NUMERIC = re.compile(r"^[0-9]+(?:[.,][0-9]+)*$")
_LANGUAGES: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile("[äöüßẞ]", re.IGNORECASE), 3.0),
    (re.compile("[éèêëàâîïôûùüÿçœæáíóúñ]", re.IGNORECASE), 3.0),
    (re.compile("[ąćęłńóśźżěščřžýůúďťň]", re.IGNORECASE), 3.5),
)
_DEFAULT_CHARS_PER_TOKEN = 6
_SHORT = 3


def _utf16_len(text: str) -> int:
    """JavaScript's ``length``: UTF-16 code units (an emoji is two)."""
    return len(text.encode("utf-16-le")) // 2


def _chars_per_token(segment: str) -> float:
    for pattern, chars in _LANGUAGES:
        if pattern.search(segment):
            return chars
    return _DEFAULT_CHARS_PER_TOKEN


def _segment_tokens(segment: str) -> int:
    if _WHITESPACE.match(segment):
        return 0
    if _CJK.search(segment):
        return len(segment)  # code points (``Array.from``)
    if _NUMERIC.match(segment):
        return 1
    length = _utf16_len(segment)
    if length <= _SHORT:
        return 1
    if _PUNCT.search(segment):
        return math.ceil(length / 2) if length > 1 else 1
    # alphanumeric or not, the same rule: its language's characters per token
    return math.ceil(length / _chars_per_token(segment))


def _segments(text: str) -> list[tuple[str, int]]:
    return [(seg, _segment_tokens(seg)) for seg in _SPLIT.split(text) if seg]


def estimate_tokens(text: str) -> int:
    """``estimateTokenCount(text)``: the reference's heuristic token count of `text`."""
    return sum(n for _, n in _segments(text)) if text else 0


def estimate_slice(text: str, max_tokens: int) -> str:
    """The first `max_tokens` estimated tokens of `text` (a segment may be cut proportionally)."""
    out: list[str] = []
    pos = 0
    for segment, count in _segments(text):
        if pos >= max_tokens:
            break
        if count == 0 or pos + count <= max_tokens:
            out.append(segment)
        else:
            end = math.ceil(((max_tokens - pos) / count) * _utf16_len(segment))
            units = segment.encode("utf-16-le")[: end * 2]
            out.append(units.decode("utf-16-le", errors="replace"))
        pos += count
    return "".join(out)
