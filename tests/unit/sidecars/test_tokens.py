"""Token counting: tiktoken's exact ids from quicktok's data, and the reference's estimator."""

from __future__ import annotations

import hashlib

import pytest
import quicktok
import tiktoken_ext.openai_public as openai_public

from procmesh.tokenx import estimate_slice, estimate_tokens
from procmesh_sidecars.builtins import tokens
from procmesh_sidecars.builtins._common import js_number, js_stringify
from procmesh_sidecars.builtins.tokens import TokenCounter

SAMPLES = [
    "hello world",
    "Hello, quicktok! 日本語 🚀 <|endoftext|> naïve café",
    "def f(x):\n    return x  # indented\n\n\ttabs",
    "1234567890 3.14159 $%^&*",
]


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_definitions_match_tiktokens_own(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    seen: dict[str, str] = {}

    def fake_load(url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        seen["hash"] = expected_hash or ""
        return {}

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", fake_load)
    official = getattr(openai_public, name)()
    spec = tokens._ENCODINGS[name]
    assert spec["pat_str"] == official["pat_str"]
    assert spec["special_tokens"] == official["special_tokens"]
    assert spec["sha256"] == seen["hash"]
    # quicktok's data reproduces the official .tiktoken file byte for byte
    assert hashlib.sha256(tokens.tiktoken_file(tokens.quicktok_ranks(name))).hexdigest() == seen["hash"]


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_ids_agree_with_quicktoks_encoder(name: str) -> None:
    counter = TokenCounter("tiktoken", name)  # type: ignore[arg-type]
    other = quicktok.get_encoding(name)
    for text in SAMPLES:
        assert counter.encode(text) == list(other.encode_ordinary(text)), text


def test_known_ids() -> None:
    assert TokenCounter("tiktoken", "cl100k_base").encode("hello world") == [15339, 1917]
    assert TokenCounter("tiktoken", "o200k_base").encode("hello world") == [24912, 2375]


def test_slice_by_tokens() -> None:
    counter = TokenCounter()
    assert counter.slice("one two three four", 2) == "one two"
    assert counter.slice("short", 10) == "short"
    assert counter.slice("anything", 0) == ""
    assert "\ufffd" in counter.slice("a 🚀🚀", 2)  # a cut inside a character is replaced, not left broken


@pytest.mark.parametrize(
    ("text", "expected"),
    [  # each figure is the reference's (tokenx 1.3.0 as @mastra/core 1.71 bundles it, run in node)
        ("", 0),
        ("hello", 1),  # short segments: one token
        ("extraordinary", 3),  # ceil(13 / 6)
        ("Straße", 2),  # German: ceil(6 / 3)
        ("1234567", 1),  # a number: one
        ("3.14", 3),  # split at the point: 3, ".", 14
        ("日本語", 3),  # CJK: one per character
        ("ひらがな", 1),  # hiragana is not in its CJK ranges: ceil(4 / 6)
        ("a  b", 2),  # whitespace is free
        ("a\n  b", 2),
        ("🚀🚀🚀", 1),  # six UTF-16 units: ceil(6 / 6)
        ("...!!!", 3),  # punctuation: ceil(6 / 2)
        ("привет мир", 2),
        ("hello, world! This is a test.", 9),
    ],
)
def test_estimator_follows_the_reference_rules(text: str, expected: int) -> None:
    assert estimate_tokens(text) == expected


def test_estimate_slice() -> None:
    assert estimate_slice("hello world again", 2) == "hello world"
    assert estimate_slice("extraordinary", 1).startswith("extra")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1"),
        (0.5, "0.5"),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (1.5e-6, "0.0000015"),
        (-0.0, "0"),
        (True, "true"),
    ],
)
def test_js_numbers(value: float, expected: str) -> None:
    assert js_number(value) == expected


def test_js_stringify() -> None:
    assert (
        js_stringify({"b": [1.0, None], "a": "é\n\u2028"}, sort_keys=True)
        == '{"a":"é\\n\u2028","b":[1,null]}'
    )
    assert js_stringify({"b": 1, "a": 2}) == '{"b":1,"a":2}'
