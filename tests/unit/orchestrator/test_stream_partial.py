"""Partial stream results on the orchestrator's side (no sockets): what one hands on, when it is
malformed, how a part's answer in several results is counted, and how parts handed on before
their guess was confirmed are matched once that guess is withdrawn."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any, cast

import pytest
from google.protobuf import struct_pb2

from procmesh import ProcessorClient, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.errors import MalformedResponseError
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.processors.speculative_member import Member
from procmesh_orchestrator.processors.speculative_partial import held, unahead
from procmesh_orchestrator.processors.stream_call import CHUNK, EFFECTS, merged, partial_items

HANDLE = ProcessorHandle(
    key="g",
    processor_id="g",
    client=cast(ProcessorClient, object()),
    options=struct_pb2.Struct(),
    hooks=frozenset({"process_output_stream"}),
    process_data_parts=False,
    timeout=5.0,
    on_failure="fail-closed",
)


def delta(text: str) -> tpb.Chunk:
    return convert.chunk_to_proto({"type": "text-delta", "payload": {"id": "t", "text": text}})


def result(seq: int, *texts: str, more: bool = False) -> ppb.StreamPartResult:
    res = ppb.StreamPartResult(seq=seq, more=more)
    for i, text in enumerate(texts):
        (res.part if i == 0 else res.extra_parts.add()).CopyFrom(delta(text))
    return res


def test_a_partial_result_hands_on_its_effects_then_its_parts() -> None:
    res = result(3, "a", "b", more=True)
    res.effects.violations.add(message="judged")
    items = partial_items(HANDLE, res, 3, True, False)
    assert [kind for kind, _ in items] == [EFFECTS, CHUNK, CHUNK]
    assert [v.message for v in items[0][1].violations] == ["judged"]


@pytest.mark.parametrize(
    ("seq", "accepted", "abort", "said"),
    [
        (2, True, False, "where part 2 was expected"),
        (3, False, False, "takes none"),
        (3, True, True, "carries an abort"),
    ],
)
def test_a_partial_result_is_malformed(seq: int, accepted: bool, abort: bool, said: str) -> None:
    res = result(3, "a", more=True)
    if abort:
        res.effects.abort.reason = "no"
    with pytest.raises(MalformedResponseError, match=said):
        partial_items(HANDLE, res, seq, accepted, False)


def test_a_parts_answer_in_several_results_counts_as_one() -> None:
    whole = merged(
        [result(3, "a", more=True), result(3, more=True), result(3, "b", "c", more=True)], result(3, "end")
    )
    assert [convert.chunk_from_proto(c)["payload"]["text"] for c in (whole.part, *whole.extra_parts)] == [
        "a",
        "b",
        "c",
        "end",
    ]
    alone = result(3, "x")
    assert merged([], alone) is alone


def _member(early: list[tuple[int, tpb.Chunk]]) -> Member:
    return cast(Member, SimpleNamespace(early=deque(early), dropped=deque()))


def test_parts_handed_on_early_are_taken_out_once_when_they_come_again() -> None:
    a, b = delta("a"), delta("b")
    member = _member([(0, a), (0, b)])
    effects: Any = object()
    items = [(EFFECTS, effects), (CHUNK, delta("a")), (CHUNK, delta("b")), (CHUNK, delta("c"))]
    assert unahead(member, items) == [(EFFECTS, effects), (CHUNK, delta("c"))]
    assert not member.early
    # parts of a guess still open are not taken out: its answer is not in yet
    member = _member([(7, a)])
    assert unahead(member, [(CHUNK, a)]) == [(CHUNK, a)]


def test_parts_handed_on_early_that_do_not_come_again_break_the_answer() -> None:
    member = _member([(0, delta("a"))])
    with pytest.raises(MalformedResponseError, match="did not come first again"):
        unahead(member, [(CHUNK, delta("other"))])


def test_dropped_parts_are_kept_until_let_go() -> None:
    member = _member([])
    a, b = delta("a"), delta("b")
    held(member, a, [])  # dropped
    held(member, b, [(CHUNK, a)])  # lets a go, holds b
    assert list(member.dropped) == [b]
    held(member, delta("c"), [(CHUNK, b), (CHUNK, delta("c"))])  # lets b go, passes c
    assert not member.dropped
