"""scenario.trace_chunks: the chunk list a conformance trace keeps."""

from __future__ import annotations

from typing import Any

from procmesh_orchestrator.cli.scenario import trace_chunks


def delta(text: str) -> dict[str, Any]:
    return {"type": "text-delta", "payload": {"id": "t0", "text": text}}


def lifecycle(kind: str) -> dict[str, Any]:
    return {"type": kind, "payload": {"stepNumber": 0, "runId": "r", "finishReason": "stop", "usage": {}}}


def test_text_is_merged_per_model_call() -> None:
    chunks = [
        lifecycle("start"),
        lifecycle("step-start"),
        delta("Hel"),
        delta("lo"),
        delta(" world"),
        lifecycle("step-finish"),
        lifecycle("step-start"),  # a retry or the next step: a new model call
        delta("Again"),
        {"type": "finish", "payload": {"finishReason": "stop", "usage": {"totalTokens": 3}}},
    ]
    assert trace_chunks(chunks) == [
        {"type": "text", "text": "Hello world"},
        {"type": "text", "text": "Again"},
        {"type": "finish", "finishReason": "stop"},
    ]


def test_step_start_splits_text_even_without_other_chunks() -> None:
    chunks = [lifecycle("step-start"), delta("a"), lifecycle("step-start"), delta("b")]
    assert trace_chunks(chunks) == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]


def test_lifecycle_chunks_are_dropped() -> None:
    chunks = [lifecycle(k) for k in ("start", "step-start", "step-finish", "reasoning-start", "raw")]
    assert trace_chunks(chunks) == []


def test_other_chunks_between_deltas_split_the_text() -> None:
    chunks = [
        lifecycle("step-start"),
        delta("a"),
        {"type": "data-progress", "data": {"pct": 50}},
        delta("b"),
        lifecycle("step-finish"),
        delta("c"),  # step-finish is not a chunk the trace keeps, but it still ends the merge
    ]
    assert trace_chunks(chunks) == [
        {"type": "text", "text": "a"},
        {"type": "data-progress", "data": {"pct": 50}},
        {"type": "text", "text": "b"},
        {"type": "text", "text": "c"},
    ]


def test_data_signal_is_reduced_to_its_kept_fields() -> None:
    data = {
        "id": "9f1c",
        "type": "reactive",
        "tagName": "system-reminder",
        "createdAt": "2026-01-01T00:00:00.000Z",
        "contents": "Be short.",
        "attributes": {"k": "v"},
        "transient": True,
    }
    chunks = [{"type": "data-signal", "data": data, "transient": True}]
    assert trace_chunks(chunks) == [
        {
            "type": "data-signal",
            "data": {
                "type": "reactive",
                "tagName": "system-reminder",
                "contents": "Be short.",
                "attributes": {"k": "v"},
                "transient": True,
            },
        }
    ]


def test_other_data_chunks_keep_their_data() -> None:
    data = {"id": "kept", "createdAt": "kept too"}
    assert trace_chunks([{"type": "data-x", "data": data}]) == [{"type": "data-x", "data": data}]


def test_tool_tripwire_and_error_chunks_are_reduced() -> None:
    call = {"toolCallId": "c1", "toolName": "weather", "args": {"city": "Paris"}}
    chunks = [
        {"type": "tool-call", "payload": call},
        {"type": "tool-result", "payload": {**call, "result": {"temp": 21}}},
        {"type": "tool-error", "payload": {**call, "error": "boom"}},
        {
            "type": "tripwire",
            "payload": {"processorId": "guard", "reason": "no", "retry": False, "metadata": {"k": 1}, "x": 2},
        },
        {"type": "error", "payload": {"message": "bad", "stack": "..."}},
    ]
    assert trace_chunks(chunks) == [
        {"type": "tool-call", "toolName": "weather", "args": {"city": "Paris"}},
        {"type": "tool-result", "toolName": "weather", "result": {"temp": 21}},
        {"type": "tool-error", "toolName": "weather", "error": "boom"},
        {"type": "tripwire", "processorId": "guard", "reason": "no", "retry": False, "metadata": {"k": 1}},
        {"type": "error", "message": "bad"},
    ]
