"""Regexes over user and model text run in linear time (RE2) and still match what `re` matched.

The adversarial tests feed 1 MB inputs under a pytest timeout instead of asserting a duration:
under `re` the old patterns took seconds on 60,000 characters and effectively forever on 1 MB
(quadratic or worse), so a regression hangs until the timeout fails it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from procmesh_sidecars import examples
from procmesh_sidecars.builtins import structured_output, token_limiter, tokens, tool_search
from procmesh_sidecars.builtins._linear_re import DIGIT, SPACE, WORD, compile_pattern
from procmesh_sidecars.builtins.regex_filter import PRESETS, RegexFilter, RegexFilterOptions, find_matches
from procmesh_sidecars.builtins.unicode_normalizer import UnicodeNormalizerOptions, normalize_text
from tests.unit.sidecars.helpers import Violations, abort

MB = 1_000_000
ADVERSARIAL = {
    "letters": "a" * MB,
    "at-signs": "a@" * (MB // 2),
    "digits": "1" * MB,
    "digits-spaced": "1 " * (MB // 2),
    "dotted": "a." * (MB // 2),
    "dashes": "1-" * (MB // 2),
    "no-tld": ("a" * 999 + "@") * (MB // 1000),
    "url-like": "http://" + "a" * MB,
    "spaces": " " * MB,
}
# The presets and example patterns as they were under Python's `re` (HEAD before RE2): the new
# RE2 patterns must find the same spans on ordinary text.
RE_PRESETS = {
    "email": (r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}", 0),
    "phone": (r"(?:\+?1[-.\s]?)?\(?[0-9]{3}\)?[-.\s]?[0-9]{3}[-.\s]?[0-9]{4}", 0),
    "ssn": (r"\b\d{3}-\d{2}-\d{4}\b", 0),
    "credit-card": (r"\b(?:\d{4}[-\s]?){3}\d{4}\b", 0),
    "api-key": (
        r"""(?:api[_-]?key|apikey|api[_-]?secret)\s*[:=]\s*["']?[a-zA-Z0-9_\-]{20,}["']?""",
        re.IGNORECASE,
    ),
    "bearer-token": (r"Bearer\s+[a-zA-Z0-9_\-.]+", re.IGNORECASE),
    "aws-key": (r"(?:AKIA|ASIA)[A-Z0-9]{16}", 0),
    "url": (r"""https?://[^\s<>"{}|\\^`\[\]]+""", re.IGNORECASE),
}
RULES = {rule.name: rule for preset in PRESETS.values() for rule in preset}
# Unicode spaces and separators next to ASCII text: where \s differs between `re` and RE2.
_SPACES = [" ", "\t", "\n", "\x0b", "\x1c", "\x85", "\u00a0", "\u2028", "\u3000"]
_PRESET_PIECES = [
    *_SPACES,
    *"aZx019@._%+-()/:=\"'`<>{}|\\^[]",
    "555",
    "1234",
    "4111",
    "api_key",
    "APIKEY",
    "Bearer",
    "AKIA",
    "ABCDEFGHIJKLMNOP",
    "https://",
    "example.com",
]
# The examples' patterns used `re`'s Unicode \w and \d: non-ASCII letters and digits matter there.
_EXAMPLE_PIECES = [*_SPACES, *"aé_ß1٣\uff11+-.@", "jo", "ex.com", "555"]
_FENCE_PIECES = ["```", "json", "JSON", "{", "}", "1", "x", "\n", *_SPACES]


def _text(pieces: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(pieces), max_size=40).map("".join)


def _spans(pattern: Any, text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in pattern.finditer(text)]


@pytest.mark.parametrize(("ours", "theirs"), [(SPACE, r"\s"), (WORD, r"\w"), (DIGIT, r"\d")])
def test_unicode_classes_are_the_ones_re_uses(ours: str, theirs: str) -> None:
    # Every code point this Python assigns (RE2's Unicode tables may be newer); no surrogates.
    chars = "".join(c for c in map(chr, range(0x110000)) if unicodedata.category(c) not in ("Cn", "Cs"))
    # Runs, not single characters: the same spans mean the same sets, with far fewer matches.
    linear = compile_pattern(f"[{ours}]+" if ours != DIGIT else f"{ours}+")
    assert _spans(linear, chars) == _spans(re.compile(f"{theirs}+"), chars)


@settings(max_examples=200, deadline=None, database=None)
@given(_text(_PRESET_PIECES))
def test_presets_match_what_they_matched_under_re(text: str) -> None:
    for name, (pattern, flags) in RE_PRESETS.items():
        assert _spans(RULES[name].compiled, text) == _spans(re.compile(pattern, flags), text), name


@settings(max_examples=200, deadline=None, database=None)
@given(_text(_EXAMPLE_PIECES))
def test_example_pii_patterns_match_what_they_matched_under_re(text: str) -> None:
    assert _spans(examples._EMAIL, text) == _spans(re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+"), text)
    assert _spans(examples._PHONE, text) == _spans(re.compile(r"\+?\d[\d -]{7,}\d"), text)


@settings(max_examples=200, deadline=None, database=None)
@given(_text(_FENCE_PIECES))
def test_fence_pattern_matches_what_it_matched_under_re(text: str) -> None:
    old = re.compile(r"^\s*```(?:json|JSON)?\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL).match(text)
    new = structured_output._FENCE.match(text)
    assert (new.group(1) if new else None) == (old.group(1) if old else None)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", sorted(RULES))
@pytest.mark.parametrize("kind", sorted(ADVERSARIAL))
def test_each_preset_rule_finishes_on_1_mb_adversarial_input(name: str, kind: str) -> None:
    find_matches(ADVERSARIAL[kind], [RULES[name]])


@pytest.mark.timeout(30)
def test_a_user_pattern_exponential_under_re_finishes() -> None:
    # (a+)+$ backtracks 2**n ways under `re` on a's followed by a non-matching character.
    options = RegexFilterOptions(rules=[{"name": "nested", "pattern": "(a+)+$"}])
    assert find_matches("a" * MB + "!", options.rules) == []


@pytest.mark.timeout(30)
async def test_regex_filter_hooks_finish_on_1_mb_input() -> None:
    processor, text = RegexFilter(), ADVERSARIAL["letters"] + " mail jo@ex.com"
    options = RegexFilterOptions(presets=["pii", "secrets", "urls"], strategy="redact")
    message = {"role": "user", "content": {"parts": [{"type": "text", "text": text}]}}
    out = await processor.process_input([message], options, abort, Violations())
    assert out is not None
    assert out[0]["content"]["parts"][0]["text"].endswith(" mail [EMAIL]")
    held = RegexFilterOptions(presets=["pii"], strategy="redact", stream_hold_back=64)
    for opts in (options, held):
        delta = {"type": "text-delta", "payload": {"id": "t", "text": text}}
        await processor.process_output_stream(delta, opts, {}, abort, Violations())


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", sorted(ADVERSARIAL))
async def test_example_pii_redactor_finishes_on_1_mb_adversarial_input(kind: str) -> None:
    message = {"role": "user", "content": {"parts": [{"type": "text", "text": ADVERSARIAL[kind]}]}}
    await examples.PiiRedactor().process_input([message])


async def test_example_pii_redactor_still_redacts() -> None:
    message = {
        "role": "user",
        "content": {"parts": [{"type": "text", "text": "mail jö@ex.de, +1 555 123 4567"}]},
    }
    (out,) = await examples.PiiRedactor().process_input([message])
    assert out["content"]["parts"][0]["text"] == "mail [email], [phone]"


@pytest.mark.timeout(30)
async def test_example_word_filter_masks_case_insensitively_on_1_mb() -> None:
    delta = {"type": "text-delta", "payload": {"text": "DaRn. " + "dar" * (MB // 3) + "darn"}}
    out = await examples.WordFilter().process_output_stream(delta, examples.WordFilterOptions())
    assert out["payload"]["text"].startswith("****. dar")
    assert out["payload"]["text"].endswith("dar****")
    small = {"type": "text-delta", "payload": {"text": "a.b darn"}}
    options = examples.WordFilterOptions(words=["a.b"])
    assert (await examples.WordFilter().process_output_stream(small, options))["payload"][
        "text"
    ] == "*** darn"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "text", ["```" + " " * MB + "x", "```json\n" + "`" * MB, " " * MB + "```", "```" + "\n```" * (MB // 4)]
)
def test_structured_output_fence_finishes_on_1_mb(text: str) -> None:
    with pytest.raises(ValueError, match="Expecting value"):
        structured_output.parse_json(text)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["letters", "digits", "spaces", "dotted"])
def test_other_built_ins_regexes_finish_on_1_mb(kind: str) -> None:
    # These stay on `re`: single character-class runs and anchored matches, linear as written.
    text = ADVERSARIAL[kind]
    tool_search.tokenize(text)
    token_limiter._SCHEME.match(text)
    normalize_text(text + "\r\n\t " * 1000, UnicodeNormalizerOptions())
    if kind != "dotted":  # linear, but 1M one-character segments cost the estimator ~10 s
        tokens.estimate_tokens(text)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a)\1", "invalid escape sequence"),
        (r"foo(?=bar)", "invalid perl operator"),
        (r"(?<!x)y", "invalid perl operator"),
        (r"(?P<w>a)(?P=w)", "invalid perl operator"),
        (r"(?>a+)", "invalid perl operator"),
        ("(", "missing \\)"),
    ],
)
def test_a_pattern_re2_refuses_is_an_options_error_naming_the_rule(pattern: str, why: str) -> None:
    with pytest.raises(ValidationError, match=rf"rule 'mine': invalid pattern .*{why}.*RE2"):
        RegexFilterOptions(rules=[{"name": "mine", "pattern": pattern}])


def test_user_rule_flags_still_apply() -> None:
    def spans(pattern: str, flags: str, text: str) -> list[tuple[int, int]]:
        rule = RegexFilterOptions(rules=[{"name": "r", "pattern": pattern, "flags": flags}]).rules[0]
        return [(m.start, m.end) for m in find_matches(text, [rule])]

    assert spans("^b", "g", "a\nb") == []
    assert spans("^b", "gm", "a\nb") == [(2, 3)]
    assert spans("a.b", "g", "a\nb") == []
    assert spans("a.b", "gs", "a\nb") == [(0, 3)]
    assert spans("É", "gi", "é É") == [(0, 1), (2, 3)]
    assert spans(r"tick-\d+", "g", "tick-42 tick-7") == [(0, 7), (8, 14)]
