"""The Node SDK's ``release`` through a real Node sidecar (twin of the Python SDK's
tests/integration/sdk_server/test_stream_release.py): with ``partial_results`` each release is
a partial result (``more``) sent at once, behind the batch's results before it and with the
violations reported so far; without it, or in a fused stream, the released parts lead the part's
one result.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh import ProcessorClient, convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from tests.e2e.node.conftest import HERE, Sidecars, node_sidecar
from tests.integration.sdk_server.support import TIMEOUT, delta, run_context, stream_request

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

STEP_END = {"type": "step-finish", "payload": {"finishReason": "stop"}}


@pytest.fixture(scope="module")
def gates(sidecars: Sidecars) -> Path:
    path = sidecars.dir / "gates"
    path.mkdir(exist_ok=True)
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(sidecars: Sidecars, gates: Path) -> AsyncIterator[ProcessorClient]:
    os.environ["GATE_DIR"] = str(gates)
    try:
        proc = node_sidecar(
            HERE / "release.mjs", f"unix://{sidecars.dir / 'release.sock'}", sidecars.dir / "release.log"
        )
    finally:
        del os.environ["GATE_DIR"]
    try:
        await proc.wait_ready()
        c = ProcessorClient(proc.address)
        yield c
        await c.close()
    finally:
        proc.stop(grace=1)


def _seen(resp: ppb.ProcessOutputStreamResponse) -> list[tuple[int, bool, list[Any], list[str]]]:
    out = []
    for r in resp.results:
        chunks = [convert.chunk_from_proto(c) for c in (r.part, *r.extra_parts)] if r.HasField("part") else []
        out.append((r.seq, r.more, chunks, [v.message for v in r.effects.violations]))
    return out


def _reset(gates: Path, *opened: str) -> None:
    for gate in gates.iterdir():
        gate.unlink()
    for text in opened:
        (gates / f"open-{text}").touch()


async def test_each_release_is_a_partial_result_sent_at_once(client: ProcessorClient, gates: Path) -> None:
    _reset(gates, "a")
    call = client.open_stream(TIMEOUT)
    first = stream_request([(1, delta("a")), (2, delta("b")), (3, STEP_END)], run_context("holder"))
    first.partial_results = True
    await call.write(first)
    # b's gate is still closed: a went on its own, behind the results before it
    assert _seen(await call.read()) == [
        (1, False, [], []),
        (2, False, [], []),
        (3, True, [delta("a")], ["judged a"]),
    ]
    (gates / "open-b").touch()
    assert _seen(await call.read()) == [(3, True, [delta("b")], ["judged b"])]
    assert _seen(await call.read()) == [(3, False, [STEP_END], [])]
    await call.done_writing()
    end = await call.read()
    assert end.HasField("end")


async def test_without_partial_results_the_released_parts_lead_the_parts_result(
    client: ProcessorClient, gates: Path
) -> None:
    _reset(gates, "a", "b")
    call = client.open_stream(TIMEOUT)
    await call.write(stream_request([(1, delta("a")), (2, delta("b")), (3, STEP_END)], run_context("holder")))
    assert _seen(await call.read()) == [
        (1, False, [], []),
        (2, False, [], []),
        (3, False, [delta("a"), delta("b"), STEP_END], ["judged a", "judged b"]),
    ]
    await call.done_writing()
    assert (await call.read()).HasField("end")


async def test_a_fused_stream_sends_no_partial_result(client: ProcessorClient, gates: Path) -> None:
    _reset(gates, "a")
    call = client.open_stream(TIMEOUT)
    ctx = run_context("holder")
    ctx.fused.append(tpb.FusedProcessor(processor_id="passer"))
    first = stream_request([(1, delta("a")), (2, STEP_END)], ctx)
    first.partial_results = True
    await call.write(first)
    assert [(s, m, c) for s, m, c, _ in _seen(await call.read())] == [
        (1, False, []),
        (2, False, [delta("a"), STEP_END]),
    ]
    await call.done_writing()
    assert (await call.read()).HasField("end")
