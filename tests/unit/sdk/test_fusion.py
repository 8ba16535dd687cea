"""Fused requests and rewinds, the pure parts: the announced signal chunk, the rewind history, `passes`.

The wire behaviour (both SDKs, real processes) is in tests/e2e/node/test_fusion_parity.py.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from procmesh import convert
from procmesh._chain import announced
from procmesh._check.fusion import _difference
from procmesh._fused import passes
from procmesh._rewind import History
from procmesh.errors import InvalidInputError
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator.run.messages import signal_data, signal_record

SIGNALS: list[dict[str, Any]] = [
    {"contents": "plain"},
    {"type": "reactive", "contents": "tagged", "tagName": "note", "attributes": {"b": 1, "a": "x"}},
    {"type": "system-reminder", "contents": "canonical"},
    {"type": "user-message", "contents": "from the user", "transient": True},
    {"type": "state", "contents": "kept", "metadata": {"k": "v"}, "id": "given-id"},
    {"type": "notification", "contents": ""},
]


@pytest.mark.parametrize("signal", SIGNALS)
def test_the_announced_chunk_is_the_one_the_orchestrator_announces(signal: dict[str, Any]) -> None:
    mine = copy.deepcopy(signal)
    chunk = announced(mine)
    record = signal_record(mine)  # as the orchestrator records the signal from the effects
    assert chunk["type"] == "data-signal"
    assert chunk["transient"] is True
    assert mine["id"] == chunk["data"]["id"] == record["id"]  # the message and the chunk agree
    if "id" in signal:
        assert mine["id"] == signal["id"]
    theirs = signal_data(record)
    assert list(chunk["data"]) == list(theirs)  # same keys, same order
    assert {**chunk["data"], "createdAt": None} == {**theirs, "createdAt": None}
    convert.chunk_to_proto(chunk)  # it can be sent


class FakeStage:
    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {"state": {}}
        self.stream_parts: list[Any] = []
        self.error = ""

    def take(self, part: ppb.StreamPart) -> None:
        """What a counting hook does with a part."""
        self.kwargs["state"]["n"] = self.kwargs["state"].get("n", 0) + 1
        self.stream_parts.append(part.seq)


def parts(*seqs: int) -> list[ppb.StreamPart]:
    return [ppb.StreamPart(seq=s) for s in seqs]


async def run_batch(history: History, stage: FakeStage, batch: list[ppb.StreamPart]) -> None:
    history.keep(batch)
    for part in batch:
        stage.take(part)


async def test_a_rewind_restores_the_batch_and_replays_the_parts_before_the_rewind_point() -> None:
    stage = FakeStage()
    history = History([stage])
    await run_batch(history, stage, parts(1, 2))
    await run_batch(history, stage, parts(3, 4, 5))
    stage.error = "INTERNAL: failed at 5"
    replayed: list[list[int]] = []

    async def replay(kept: list[ppb.StreamPart]) -> None:
        replayed.append([p.seq for p in kept])
        for part in kept:
            stage.take(part)

    await history.rewind(4, replay)
    assert replayed == [[3]]
    assert stage.kwargs["state"] == {"n": 3}
    assert stage.stream_parts == [1, 2, 3]
    assert stage.error == ""  # the failure came after the rewind point
    # The kept part can be withdrawn too, from the same "before".
    await history.rewind(3, replay)
    assert replayed == [[3]]  # nothing before seq 3 in that batch to replay
    assert stage.kwargs["state"] == {"n": 2}
    assert stage.stream_parts == [1, 2]


async def test_a_rewind_past_every_part_withdraws_nothing() -> None:
    stage = FakeStage()
    history = History([stage])
    await run_batch(history, stage, parts(1, 2))

    async def replay(kept: list[ppb.StreamPart]) -> None:
        raise AssertionError("nothing to replay")

    await history.rewind(9, replay)
    assert stage.kwargs["state"] == {"n": 2}


async def test_committed_parts_are_forgotten_and_cannot_be_rewound() -> None:
    stage = FakeStage()
    history = History([stage])
    await run_batch(history, stage, parts(1, 2))
    await run_batch(history, stage, parts(3))
    history.commit(2)

    async def replay(kept: list[ppb.StreamPart]) -> None:
        for part in kept:
            stage.take(part)

    with pytest.raises(InvalidInputError, match="rewind_to 2 is at or below committed_through 2"):
        await history.rewind(2, replay)
    await history.rewind(3, replay)
    assert stage.kwargs["state"] == {"n": 2}  # the record of batch 2 was the one kept


def test_a_response_passes_only_when_it_sets_nothing_but_effects_without_signals_or_abort() -> None:
    assert passes(ppb.ProcessInputResponse())
    quiet = ppb.ProcessInputResponse()
    quiet.effects.custom_chunks.add(type="data-x")
    quiet.effects.state.update({"n": 1})
    assert passes(quiet)
    assert not passes(ppb.ProcessInputResponse(replace_messages=True))
    signalled = ppb.ProcessInputResponse()
    signalled.effects.signals.add(contents="hi")
    assert not passes(signalled)
    aborted = ppb.ProcessInputResponse()
    aborted.effects.abort.reason = "no"
    assert not passes(aborted)
    assert not passes(ppb.ProcessLLMResponseResponse(output_result_if_clean=True))


def test_the_checker_names_where_a_fused_answer_differs_from_the_plain_calls() -> None:
    same = {"effects": {"fused": [{"effects": {"state": {"n": 1}}}]}}
    assert _difference(same, copy.deepcopy(same)) == ""
    other = {"effects": {"fused": [{"effects": {"state": {"n": 2}}}]}}
    assert _difference(other, same) == ".effects.fused[0].effects.state.n: 2 where the plain calls give 1"
    assert _difference({"messages": []}, {}) == ".messages only in the fused answer"
    assert _difference({}, {"messages": []}) == ".messages only in the plain answer"
