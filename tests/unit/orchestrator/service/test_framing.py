"""The wire framing of a stream's deltas (`results.Framing`): text-start/text-end and
reasoning-start/reasoning-end around each block, as the reference sends them."""

from __future__ import annotations

from typing import Any

from procmesh_orchestrator.service.api.results import Framing


def delta(kind: str, block_id: str, text: str = "x") -> dict[str, Any]:
    return {"type": f"{kind}-delta", "payload": {"id": block_id, "text": text}}


def framed(chunks: list[dict[str, Any]]) -> list[str]:
    framing = Framing()
    out = [c for chunk in chunks for c in framing.frame(chunk)] + framing.close()
    return [f"{c['type']}:{(c.get('payload') or {}).get('id', '')}" for c in out]


def test_each_block_is_opened_before_its_first_delta_and_closed_before_the_next_chunk() -> None:
    chunks = [
        {"type": "start"},
        delta("reasoning", "r0"),
        delta("reasoning", "r0"),
        delta("text", "t0"),
        {"type": "data-progress", "data": {}},  # custom data stays inside the block
        delta("text", "t0"),
        {"type": "tool-call", "payload": {}},
        delta("text", "t1"),
        {"type": "step-finish", "payload": {}},
    ]
    assert framed(chunks) == [
        "start:",
        "reasoning-start:r0",
        "reasoning-delta:r0",
        "reasoning-delta:r0",
        "reasoning-end:r0",
        "text-start:t0",
        "text-delta:t0",
        "data-progress:",
        "text-delta:t0",
        "text-end:t0",
        "tool-call:",
        "text-start:t1",
        "text-delta:t1",
        "text-end:t1",
        "step-finish:",
    ]


def test_a_stream_cut_mid_block_still_closes_it() -> None:
    assert framed([delta("text", "t0")]) == ["text-start:t0", "text-delta:t0", "text-end:t0"]


def test_a_stream_that_frames_itself_is_passed_as_it_is() -> None:
    own = [
        {"type": "text-start", "payload": {"id": "a"}},
        delta("text", "a"),
        {"type": "text-end", "payload": {"id": "a"}},
        {"type": "finish", "payload": {}},
    ]
    assert framed(own) == ["text-start:a", "text-delta:a", "text-end:a", "finish:"]
