"""Response messages as the AI SDK v5 UI messages of ``result.response.uiMessages`` (SEED-GAPS H8),
shaped as the reference's AIV5Adapter.toUIMessage makes them."""

from __future__ import annotations

from procmesh_orchestrator.service.api.ui_messages import ui_message, ui_messages


def test_metadata_holds_the_contents_metadata_and_the_message_ids() -> None:
    message = {
        "id": "m1",
        "role": "assistant",
        "createdAt": "2026-12-05T08:00:00.000Z",
        "threadId": "t",
        "resourceId": "r",
        "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}], "metadata": {"customData": "x"}},
    }
    assert ui_messages([message]) == [
        {
            "id": "m1",
            "role": "assistant",
            "metadata": {
                "customData": "x",
                "createdAt": "2026-12-05T08:00:00.000Z",
                "threadId": "t",
                "resourceId": "r",
            },
            "parts": [{"type": "text", "text": "hi"}],
        }
    ]


def test_tool_parts_take_the_ui_states_and_keep_the_model_output() -> None:
    meta = {"mastra": {"modelOutput": {"type": "text", "value": "2 rows"}}}
    parts = [
        {"type": "step-start"},
        {
            "type": "tool-invocation",
            "toolInvocation": {
                "state": "result",
                "toolCallId": "c1",
                "toolName": "report",
                "args": {},
                "result": 1,
            },
            "providerMetadata": meta,
        },
        {
            "type": "tool-invocation",
            "toolInvocation": {
                "state": "output-error",
                "toolCallId": "c2",
                "toolName": "boom",
                "args": {},
                "errorText": "no",
            },
        },
        {
            "type": "tool-invocation",
            "toolInvocation": {"state": "call", "toolCallId": "c3", "toolName": "x", "args": {"a": 1}},
        },
        {"type": "reasoning", "text": "think"},
        {"type": "file", "mediaType": "image/png", "data": "iVBOR"},
        {"type": "data-report", "data": {"row": 1}},
    ]
    out = ui_message({"id": "m", "role": "assistant", "content": {"format": 2, "parts": parts}})
    assert out["parts"] == [
        {"type": "step-start"},
        {
            "type": "tool-report",
            "toolCallId": "c1",
            "input": {},
            "state": "output-available",
            "output": 1,
            "callProviderMetadata": meta,
        },
        {"type": "tool-boom", "toolCallId": "c2", "input": {}, "state": "output-error", "errorText": "no"},
        {"type": "tool-x", "toolCallId": "c3", "input": {"a": 1}, "state": "input-available"},
        {"type": "reasoning", "text": "think", "state": "done"},
        {"type": "file", "url": "data:image/png;base64,iVBOR", "mediaType": "image/png"},
        {"type": "data-report", "data": {"row": 1}},
    ]


def test_the_legacy_flat_text_is_a_text_part_when_there_is_no_other_text() -> None:
    flat = {"id": "u", "role": "user", "content": {"format": 2, "parts": [], "content": "old form"}}
    assert ui_message(flat)["parts"] == [{"type": "text", "text": "old form"}]
    both = {
        "id": "u",
        "role": "user",
        "content": {"format": 2, "parts": [{"type": "text", "text": "new"}], "content": "old"},
    }
    assert ui_message(both)["parts"] == [{"type": "text", "text": "new"}]


def test_a_signal_is_a_system_message() -> None:
    signal = {"id": "s", "role": "signal", "content": {"format": 2, "parts": [{"type": "text", "text": "x"}]}}
    assert ui_message(signal)["role"] == "system"
