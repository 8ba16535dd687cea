"""The seeds' legacy flattened ``message.content.content`` (SEED-GAPS B6): read on a decoded message,
and a message whose only text is that string converts with it as a text part."""

from __future__ import annotations

import json

from procmesh import convert


def test_a_decoded_message_reads_its_text_as_content_content() -> None:
    sent = {
        "id": "m",
        "role": "user",
        "content": {"format": 2, "parts": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    }
    message = convert.message_from_proto(convert.message_to_proto(sent))
    assert message["content"]["content"] == "a\nb"
    assert message["content"].get("content") == "a\nb"
    assert message == sent  # not a key: compares and serializes as the plain dict
    assert "content" not in json.loads(json.dumps(message["content"]))


def test_without_text_there_is_no_flat_text() -> None:
    message = convert.message_from_proto(
        convert.message_to_proto({"id": "m", "role": "assistant", "content": {"parts": []}})
    )
    assert message["content"].get("content") is None
    assert "content" not in message["content"]


def test_a_message_with_only_the_flat_string_converts_with_a_text_part() -> None:
    legacy = {"id": "m", "role": "user", "content": {"format": 2, "parts": [], "content": "old form"}}
    assert convert.message_from_proto(convert.message_to_proto(legacy))["content"]["parts"] == [
        {"type": "text", "text": "old form"}
    ]
