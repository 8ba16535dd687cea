"""The guards' pure logic: window cutting and hold-back bookkeeping, redaction, language codes, and
the runnable configurations docs/builtins.md gives for them."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from procmesh_orchestrator.config import parse_config
from procmesh_sidecars.builtins.guards import GUARDS, _windows
from procmesh_sidecars.builtins.guards._verdicts import with_text
from procmesh_sidecars.builtins.guards._windows import WindowOptions
from procmesh_sidecars.builtins.guards.language import code_of, is_target, name_of
from procmesh_sidecars.builtins.guards.pii import PIIOptions, mask, redact
from procmesh_sidecars.builtins.guards.system_prompt import SystemPromptOptions, _Found, scrub
from tests.conftest import REPO


def delta(text: str) -> dict[str, Any]:
    return {"type": "text-delta", "payload": {"id": "t0", "text": text}}


TOOL = {"type": "tool-call", "payload": {"toolCallId": "c1", "toolName": "f", "args": {}}}


# -- where a window ends ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ends"),
    [
        ("Hello there. ", True),
        ("Really?\n", True),
        ('He said "stop!" ', True),
        ("好的。", True),
        ("Wait for it… ", True),
        ("Hello there.", False),  # the next delta decides: "jane@example." may go on ".com"
        ("mid sentence", False),
        ("3.14 is pi", False),
        ("   ", False),
    ],
)
def test_a_window_is_complete_at_a_sentence_end_nothing_can_extend(text: str, ends: bool) -> None:
    assert _windows.ends_window(text, WindowOptions()) is ends


@pytest.mark.parametrize(
    ("text", "following", "ends"),
    [
        ("Hello there.", " Next", True),
        ("Done!", "\nNext", True),
        ("mail jane@example.", "com", False),
        ("pi is 3.", "14", False),
        ("no stop", " here", False),
    ],
)
def test_a_stop_ending_a_delta_ends_the_window_when_whitespace_follows(
    text: str, following: str, ends: bool
) -> None:
    assert _windows.ends_before(text, following, WindowOptions()) is ends
    assert not _windows.ends_before(text, following, WindowOptions(window_boundary="chars"))


def test_a_split_email_stays_in_one_window() -> None:
    state: dict[str, Any] = {}
    options = WindowOptions()
    closed = [
        w
        for d in ("Mail jane@example.", "com", " now.", " Bye")
        for w in _windows.add_text(state, delta(d), options, hold=True)
    ]
    assert [w["text"] for w in closed] == ["Mail jane@example.com now."]


def test_size_closes_a_window_and_chars_mode_ignores_sentences() -> None:
    assert _windows.ends_window("x" * 200, WindowOptions())
    assert not _windows.ends_window("x" * 199, WindowOptions())
    chars = WindowOptions(window_size=10, window_boundary="chars")
    assert not _windows.ends_window("Short.", chars)
    assert _windows.ends_window("0123456789", chars)


def test_window_options_are_validated() -> None:
    with pytest.raises(ValidationError):
        WindowOptions(window_size=0)
    with pytest.raises(ValidationError):
        WindowOptions(window_boundary="words")


# -- hold-back bookkeeping --------------------------------------------------------------------


def test_held_deltas_close_windows_in_order() -> None:
    state: dict[str, Any] = {}
    options = WindowOptions()
    assert _windows.add_text(state, delta("Hello"), options, hold=True) == []
    assert _windows.add_text(state, delta(" there."), options, hold=True) == []
    [first] = _windows.add_text(state, delta(" More"), options, hold=True)  # whitespace: the sentence ended
    assert first["text"] == "Hello there."
    assert first["parts"] == [delta("Hello"), delta(" there.")]
    held = _windows.windows(state)
    assert [w["closed"] for w in held] == [True, False]
    assert _windows.pop_head(state) is first
    assert _windows.pop_head(state) is None  # the open window waits
    assert _windows.close_open(state)["text"] == " More"  # type: ignore[index]


def test_one_delta_can_close_two_windows() -> None:
    state: dict[str, Any] = {}
    options = WindowOptions(window_size=10)
    _windows.add_text(state, delta("Short."), options, hold=True)
    closed = _windows.add_text(state, delta(" and a long delta"), options, hold=True)
    assert [w["text"] for w in closed] == ["Short.", " and a long delta"]


def test_without_hold_a_window_keeps_only_its_text() -> None:
    state: dict[str, Any] = {}
    [closed] = _windows.add_text(state, delta("Done. "), WindowOptions(), hold=False)
    assert closed["parts"] == []
    assert not _windows.hold_behind(state, TOOL)  # nothing held: the part may go at once


def test_a_non_text_part_waits_behind_held_text_and_closes_its_window() -> None:
    state: dict[str, Any] = {}
    _windows.add_text(state, delta("Let me check"), WindowOptions(), hold=True)
    assert _windows.hold_behind(state, TOOL)
    window = _windows.head(state)
    assert window is not None
    assert window["closed"]
    assert _windows.text_parts(window) == [delta("Let me check")]
    assert _windows.other_parts(window) == [TOOL]


def test_a_replaced_window_is_one_delta_then_its_other_parts() -> None:
    window = {"id": "w", "text": "a b", "parts": [delta("a"), delta(" b"), TOOL], "closed": True}
    assert _windows.replaced(window, "[X]") == [delta("[X]"), TOOL]
    assert _windows.replaced(window, "") == [TOOL]


# -- redaction --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "kind", "masked"),
    [
        ("jane@example.com", "email", "j**e@*******.com"),
        ("al@x.io", "email", "***@*.io"),
        ("555-123-4567", "phone", "XXX-XXX-4567"),
        ("4111 1111 1111 1234", "credit-card", "**** **** **** 1234"),
        ("123-45-6789", "ssn", "***-**-6789"),
        ("123e4567-e89b-12d3-a456-426614174000", "uuid", "********-****-****-****-************"),
        ("0x52908400098527886E0F7030069857D2E4169EE7", "crypto-wallet", "0x52" + "*" * 34 + "9EE7"),
        ("DE89370400440532013000", "iban", "DE" + "*" * 16 + "3000"),
        ("Alice Smith", "name", "A*********h"),
        ("Bo", "name", "**"),
    ],
)
def test_mask_keeps_each_types_shape(value: str, kind: str, masked: str) -> None:
    assert mask(value, kind, preserve_format=True) == masked


def test_mask_without_format_is_at_most_eight_stars() -> None:
    assert mask("jane@example.com", "email", preserve_format=False) == "********"
    assert mask("abc", "name", preserve_format=False) == "***"


def test_redact_replaces_every_occurrence_by_method() -> None:
    found = [("email", "a@b.io"), ("name", "Ann")]
    text = "Ann wrote from a@b.io, then Ann again."
    assert redact(text, found, PIIOptions(model="m", redaction_method="placeholder")) == (
        "[NAME] wrote from [EMAIL], then [NAME] again."
    )
    digest = hashlib.sha256(b"a@b.io").hexdigest()[:8]
    assert f"[HASH:{digest}]" in str(redact(text, found, PIIOptions(model="m", redaction_method="hash")))
    assert (
        redact(text, found, PIIOptions(model="m", redaction_method="remove")) == " wrote from , then  again."
    )
    assert redact(text, [("email", "zzz@q.io")], PIIOptions(model="m")) is None


def test_overlapping_values_redact_as_one_region_of_the_longest() -> None:
    found = [("name", "Smith"), ("email", "john.smith@acme.com"), ("name", "john.smith")]
    options = PIIOptions(model="m", redaction_method="placeholder")
    assert redact("mail john.smith@acme.com", found, options) == "mail [EMAIL]"


def test_scrub_by_method() -> None:
    found = [_Found("system-prompt", "SECRET")]
    text = "a SECRET and SECRET"
    assert scrub(text, found, SystemPromptOptions(model="m")) == "a ****** and ******"
    placeholder = SystemPromptOptions(model="m", redaction_method="placeholder", placeholder_text="<x>")
    assert scrub(text, found, placeholder) == "a <x> and <x>"
    assert scrub(text, found, SystemPromptOptions(model="m", redaction_method="remove")) == "a  and "


def test_a_custom_pattern_re2_refuses_is_an_options_error() -> None:
    with pytest.raises(ValidationError, match="custom_patterns"):
        SystemPromptOptions(model="m", custom_patterns=[r"(a)\1"])


def test_with_text_keeps_non_text_parts() -> None:
    image = {"type": "image", "image": "data:..."}
    message = {
        "role": "user",
        "content": {
            "format": 2,
            "parts": [{"type": "text", "text": "a"}, image, {"type": "text", "text": "b"}],
        },
    }
    assert with_text(message, "X")["content"]["parts"] == [{"type": "text", "text": "X"}, image]


# -- languages --------------------------------------------------------------------------------


def test_language_names_and_codes() -> None:
    assert code_of("French") == "fr"
    assert code_of("EN") == "en"
    assert code_of("Klingon") == "unknown"
    assert name_of("de") == "German"
    assert is_target("fr", ["French"])
    assert is_target("EN", ["English", "en"])
    assert not is_target("de", ["English", "en"])
    assert is_target(None, ["English"])


# -- docs/builtins.md -------------------------------------------------------------------------


def _guard_configs() -> list[dict[str, Any]]:
    text = (REPO / "docs" / "builtins.md").read_text(encoding="utf-8")
    section = text[text.index("## LLM-judged guards") : text.index("## What the orchestrator would need")]
    blocks = re.findall(r"^```yaml\n(.*?)^```", section, flags=re.M | re.S)
    return [yaml.safe_load(block) for block in blocks]


def test_every_guard_has_a_documented_config_that_parses() -> None:
    configs = _guard_configs()
    seen: set[str] = set()
    for raw in configs:
        config = parse_config(raw, "docs/builtins.md")
        for agent in config.agents.values():
            for ref in [*agent.input_processors, *agent.output_processors]:
                pid = ref.processor_id  # type: ignore[union-attr]
                GUARDS[pid].Options.model_validate(ref.options)  # type: ignore[union-attr]
                seen.add(pid)
    assert seen == set(GUARDS)
