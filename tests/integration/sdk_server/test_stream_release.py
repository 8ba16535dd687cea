"""ProcessOutputStream's ``release``: a hook lets held parts go while it still processes a part.

On a real ProcessorServer: with ``partial_results`` in the first request, each ``release`` is a
partial result (``more``) sent at once, behind the batch's results before it and with the
violations reported so far; the part's last result carries the rest. Without it (an older
orchestrator) or in a fused stream, what was released leads the part's one result, as before.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from procmesh import Processor, ProcessorClient, convert
from procmesh.testing import serve_for_test
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from tests.integration.sdk_server.support import TIMEOUT, delta, finish, run_context, stream_request

pytestmark = pytest.mark.asyncio(loop_scope="module")

GATES: dict[str, threading.Event] = {}
STEP_END = {"type": "step-finish", "payload": {"finishReason": "stop"}}


class Holder(Processor):
    """Holds every text delta; at the step's end lets each go once its gate opens."""

    id = "holder"

    async def process_output_stream(
        self, part: dict[str, Any], state: dict[str, Any], release: Any, report_violation: Any
    ) -> Any:
        if part["type"] == "text-delta":
            state.setdefault("held", []).append(part)
            return None
        for held in state.pop("held", []):
            text = held["payload"]["text"]
            await asyncio.to_thread(GATES[text].wait, 10)
            report_violation(f"judged {text}")
            release(held)
        return part


class Passer(Processor):
    id = "passer"

    async def process_output_stream(self, part: dict[str, Any]) -> dict[str, Any]:
        return part


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[ProcessorClient]:
    async with serve_for_test([Holder(), Passer()]) as c:
        yield c


def _chunks(res: ppb.StreamPartResult) -> list[Any]:
    if not res.HasField("part"):
        return []
    return [convert.chunk_from_proto(c) for c in (res.part, *res.extra_parts)]


def _violations(res: ppb.StreamPartResult) -> list[str]:
    return [v.message for v in res.effects.violations]


def _open(*texts: str) -> None:
    for text in texts:
        GATES[text].set()


def _close(*texts: str) -> None:
    GATES.clear()
    GATES.update({t: threading.Event() for t in texts})


async def test_each_release_is_a_partial_result_sent_at_once(client: ProcessorClient) -> None:
    _close("a", "b")
    _open("a")
    call = client.open_stream(TIMEOUT)
    first = stream_request([(1, delta("a")), (2, delta("b")), (3, STEP_END)], run_context("holder"))
    first.partial_results = True
    await call.write(first)
    resp = await call.read()  # b's gate is still closed: a went on its own
    assert [(r.seq, r.more, _chunks(r), _violations(r)) for r in resp.results] == [
        (1, False, [], []),
        (2, False, [], []),
        (3, True, [delta("a")], ["judged a"]),
    ]
    _open("b")
    resp = await call.read()
    assert [(r.seq, r.more, _chunks(r), _violations(r)) for r in resp.results] == [
        (3, True, [delta("b")], ["judged b"])
    ]
    resp = await call.read()
    assert [(r.seq, r.more, _chunks(r)) for r in resp.results] == [(3, False, [STEP_END])]
    await call.done_writing()
    assert await finish(call) == {}


async def test_without_partial_results_the_released_parts_lead_the_parts_result(
    client: ProcessorClient,
) -> None:
    _close("a", "b")
    _open("a", "b")
    call = client.open_stream(TIMEOUT)
    await call.write(stream_request([(1, delta("a")), (2, delta("b")), (3, STEP_END)], run_context("holder")))
    resp = await call.read()
    assert [(r.seq, r.more, _chunks(r), _violations(r)) for r in resp.results] == [
        (1, False, [], []),
        (2, False, [], []),
        (3, False, [delta("a"), delta("b"), STEP_END], ["judged a", "judged b"]),
    ]
    await call.done_writing()
    assert await finish(call) == {}


async def test_a_fused_stream_sends_no_partial_result(client: ProcessorClient) -> None:
    _close("a")
    _open("a")
    call = client.open_stream(TIMEOUT)
    ctx = run_context("holder")
    ctx.fused.append(tpb.FusedProcessor(processor_id="passer"))
    first = stream_request([(1, delta("a")), (2, STEP_END)], ctx)
    first.partial_results = True
    await call.write(first)
    resp = await call.read()
    assert [(r.seq, r.more, _chunks(r)) for r in resp.results] == [
        (1, False, []),
        (2, False, [delta("a"), STEP_END]),
    ]
    await call.done_writing()
    await call.read()  # the end
