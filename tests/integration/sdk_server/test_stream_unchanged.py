"""ProcessOutputStream's ``unchanged_results``: a run of parts given back as they came is one result.

On a real ProcessorServer over gRPC: when the first request sets ``unchanged_results``, the text
deltas a hook gives back equal to what it was given, with no effects, are answered by one result
per run of consecutive seqs (``unchanged_through``), with no part; anything else (a rewrite in
place, an effect, a part that is no text delta, a part a partial result was sent for) keeps a
result of its own, and a gap in the seqs starts a new run. Without the flag (an older
orchestrator) every part has its own result holding it, as before. A fused stream does the same
when every processor gave the part back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from procmesh import Processor, ProcessorClient, TripWire, convert
from procmesh.testing import serve_for_test
from procmesh.v1 import types_pb2 as tpb
from tests.integration.sdk_server.support import TIMEOUT, delta, finish, run_context, stream_request

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOOL_CALL = {"type": "tool-call", "payload": {"toolCallId": "c1", "toolName": "t", "args": {}}}
DATA = {"type": "data-progress", "data": {"done": 1}}
GATE = threading.Event()


class Passer(Processor):
    id = "passer"

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        return part


class Copier(Processor):
    """Gives back an equal copy: unchanged, though not the same object."""

    id = "copier"

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        return {"type": part["type"], "payload": dict(part.get("payload") or {})}


class Shouter(Processor):
    """Upper-cases a delta in place and gives back the same dict: changed."""

    id = "shouter"

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        if part["type"] == "text-delta":
            part["payload"]["text"] = part["payload"]["text"].upper()
        return part


class Clearer(Processor):
    """Empties a text delta's payload in place and gives the part back."""

    id = "clearer"

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        part["payload"].clear()
        return part


class Flagger(Processor):
    """Reports a violation on deltas saying "bad" and gives every part back."""

    id = "flagger"

    async def process_output_stream(self, part: dict[str, Any], report_violation: Any) -> dict[str, Any]:
        if part["type"] == "text-delta" and part["payload"]["text"] == "bad":
            report_violation("bad word")
        return part


class Thrower(Processor):
    """Declares no effect argument; raises a TripWire on deltas saying "stop"."""

    id = "thrower"

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        if part["type"] == "text-delta" and part["payload"]["text"] == "stop":
            raise TripWire("stop word", metadata={"at": "stop"})
        return part


class Releaser(Processor):
    """Holds deltas saying "hold"; on "go" lets them go (once its gate opens) and gives "go" back."""

    id = "releaser"

    async def process_output_stream(self, part: dict[str, Any], state: dict[str, Any], release: Any) -> Any:
        text = part["payload"]["text"] if part["type"] == "text-delta" else ""
        if text == "hold":
            state.setdefault("held", []).append(part)
            return None
        if text == "go":
            await asyncio.to_thread(GATE.wait, 10)
            release(state.pop("held", []))
        return part


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[ProcessorClient]:
    processors = [Passer(), Copier(), Shouter(), Clearer(), Flagger(), Releaser(), Thrower()]
    async with serve_for_test(processors) as c:
        yield c


def _answers(results: Any) -> list[tuple[Any, ...]]:
    """Each result as (seq, through, chunks, violations, more)."""
    out = []
    for r in results:
        chunks = [convert.chunk_from_proto(c) for c in (r.part, *r.extra_parts)] if r.HasField("part") else []
        violations = [v.message for v in r.effects.violations]
        out.append((r.seq, r.unchanged_through, chunks, violations, r.more))
    return out


async def _exchange(
    client: ProcessorClient, ctx: tpb.RunContext, parts: list[tuple[int, Any]], *, unchanged: bool = True
) -> list[tuple[Any, ...]]:
    call = client.open_stream(TIMEOUT)
    first = stream_request(parts, ctx)
    first.unchanged_results = unchanged
    await call.write(first)
    resp = await call.read()
    await call.done_writing()
    await finish(call)
    return _answers(resp.results)


PARTS = [(1, delta("a")), (2, delta("b")), (3, TOOL_CALL), (4, delta("c")), (5, DATA), (6, delta("d"))]


async def test_runs_of_unchanged_deltas_and_passed_data_parts_are_one_result_each(
    client: ProcessorClient,
) -> None:
    # the data part never reaches the hook (no process_data_parts): it passes, unchanged too
    assert await _exchange(client, run_context("passer"), PARTS) == [
        (1, 2, [], [], False),
        (3, 0, [TOOL_CALL], [], False),  # no text delta: answered as always
        (4, 6, [], [], False),
    ]


async def test_without_the_flag_every_part_has_its_own_result(client: ProcessorClient) -> None:
    assert await _exchange(client, run_context("passer"), PARTS, unchanged=False) == [
        (seq, 0, [chunk], [], False) for seq, chunk in PARTS
    ]


async def test_an_equal_copy_is_unchanged(client: ProcessorClient) -> None:
    parts = [(1, delta("a")), (2, delta("b"))]
    assert await _exchange(client, run_context("copier"), parts) == [(1, 2, [], [], False)]


async def test_a_part_changed_in_place_keeps_its_own_result(client: ProcessorClient) -> None:
    parts = [(1, delta("a")), (2, delta("b"))]
    assert await _exchange(client, run_context("shouter"), parts) == [
        (1, 0, [delta("A")], [], False),
        (2, 0, [delta("B")], [], False),
    ]


async def test_a_part_emptied_in_place_keeps_its_own_result(client: ProcessorClient) -> None:
    """Given back as the same dict with its payload's keys taken away: encoded as it now is."""
    parts = [(1, delta("a")), (2, delta("b"))]
    emptied = {"type": "text-delta", "payload": {"text": ""}}
    assert await _exchange(client, run_context("clearer"), parts) == [
        (1, 0, [emptied], [], False),
        (2, 0, [emptied], [], False),
    ]


async def test_a_part_with_effects_keeps_its_own_result_and_splits_the_run(client: ProcessorClient) -> None:
    parts = [(1, delta("ok")), (2, delta("bad")), (3, delta("ok")), (4, delta("ok"))]
    assert await _exchange(client, run_context("flagger"), parts) == [
        (1, 1, [], [], False),
        (2, 0, [delta("bad")], ["bad word"], False),
        (3, 4, [], [], False),
    ]


async def test_a_tripwire_after_unchanged_parts_aborts_that_part(client: ProcessorClient) -> None:
    # a hook given no effect argument shares its quiet effects between parts (`_alone`): the
    # abort is the part's own, and the parts before it are still one unchanged run
    call = client.open_stream(TIMEOUT)
    parts = [(1, delta("a")), (2, delta("b")), (3, delta("stop")), (4, delta("c"))]
    first = stream_request(parts, run_context("thrower"))
    first.unchanged_results = True
    await call.write(first)
    resp = await call.read()
    await call.done_writing()
    results = list(resp.results)
    assert [(r.seq, r.unchanged_through) for r in results] == [(1, 2), (3, 0)]
    assert results[1].effects.abort.reason == "stop word"
    end = await call.read()
    assert end.HasField("end")


async def test_a_gap_in_the_seqs_starts_a_new_run(client: ProcessorClient) -> None:
    # parts withdrawn before they were sent leave a gap: a run covers consecutive seqs only
    parts = [(1, delta("a")), (2, delta("b")), (5, delta("c")), (6, delta("d"))]
    assert await _exchange(client, run_context("passer"), parts) == [
        (1, 2, [], [], False),
        (5, 6, [], [], False),
    ]


async def test_a_part_after_a_partial_result_is_answered_in_full(client: ProcessorClient) -> None:
    # its answer completes the partial one: never folded into a run
    GATE.set()
    call = client.open_stream(TIMEOUT)
    first = stream_request(
        [(1, delta("x")), (2, delta("hold")), (3, delta("go")), (4, delta("y"))], run_context("releaser")
    )
    first.partial_results = first.unchanged_results = True
    await call.write(first)
    got = []
    while len(got) < 5:
        got += _answers((await call.read()).results)
    await call.done_writing()
    await finish(call)
    assert got == [
        (1, 1, [], [], False),
        (2, 0, [], [], False),  # held: dropped for now
        (3, 0, [delta("hold")], [], True),
        (3, 0, [delta("go")], [], False),
        (4, 4, [], [], False),
    ]


async def test_a_fused_stream_answers_a_run_every_processor_passed(client: ProcessorClient) -> None:
    ctx = run_context("passer")
    ctx.fused.append(tpb.FusedProcessor(processor_id="copier"))
    assert await _exchange(client, ctx, [(1, delta("a")), (2, delta("b"))]) == [(1, 2, [], [], False)]
    ctx = run_context("passer")
    ctx.fused.append(tpb.FusedProcessor(processor_id="shouter"))
    answers = await _exchange(client, ctx, [(1, delta("a")), (2, delta("b"))])
    assert [(seq, through, chunks) for seq, through, chunks, _, _ in answers] == [
        (1, 0, [delta("A")]),
        (2, 0, [delta("B")]),
    ]


async def test_a_transient_delta_is_answered_in_full(client: ProcessorClient) -> None:
    # its conversion drops `transient`: giving the dict back is not giving the part back
    req = stream_request([(1, delta("a"))], run_context("passer"))
    req.parts[0].part.transient = True
    req.unchanged_results = True
    call = client.open_stream(TIMEOUT)
    await call.write(req)
    resp = await call.read()
    await call.done_writing()
    await finish(call)
    assert [(r.seq, r.unchanged_through, r.HasField("part")) for r in resp.results] == [(1, 0, True)]
