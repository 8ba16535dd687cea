"""A stream session keeps the parts so far (``stream_parts``) only for a hook that declares them.

On a real ProcessorServer over gRPC: a hook declaring ``stream_parts`` sees every part before and
including its own, as the seeds' ``streamParts``; a hook that does not declare it never sees them,
so the session holds no part past its call (a 1,000-delta stream kept 1,000 dicts a processor to
its end, and the sidecar's garbage collector traversed them again and again: bench P2).
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from procmesh import Processor, ProcessorClient
from procmesh.testing import serve_for_test
from tests.integration.sdk_server.support import TIMEOUT, delta, finish, run_context, stream_request

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOOKS = {1, 50, 100}
"""The parts at which a hook looks for a list holding its part (a scan of the heap each)."""


def held_in_a_list(part: dict[str, Any]) -> bool:
    """Whether a list ends with `part`: what keeping it in the session's parts so far looks like."""
    return any(type(r) is list and r and r[-1] is part for r in gc.get_referrers(part))


class Counting(Processor):
    """Declares ``stream_parts``: records how many it sees, and whether its part is held in a list."""

    id = "counting"

    async def process_output_stream(
        self, part: dict[str, Any], stream_parts: list[Any], state: dict[str, Any]
    ) -> dict[str, Any]:
        n = int(part["payload"]["text"])
        state.setdefault("seen", []).append(len(stream_parts))
        if n in LOOKS:
            state.setdefault("held", []).append(held_in_a_list(part))
        return part


class Plain(Processor):
    """Does not declare ``stream_parts``."""

    id = "plain"

    async def process_output_stream(self, part: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        if int(part["payload"]["text"]) in LOOKS:
            state.setdefault("held", []).append(held_in_a_list(part))
        return part


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncIterator[ProcessorClient]:
    async with serve_for_test([Counting(), Plain()]) as c:
        yield c


async def _stream(client: ProcessorClient, processor: str, n: int) -> dict[str, Any]:
    """`n` deltas ("1" ... "n") in two requests; the state the session ended with."""
    call = client.open_stream(TIMEOUT)
    parts = [(i, delta(str(i))) for i in range(1, n + 1)]
    half = n // 2
    await call.write(stream_request(parts[:half], run_context(processor)))
    await call.write(stream_request(parts[half:]))
    answered = 0
    while answered < n:
        resp = await call.read()
        answered += sum((r.unchanged_through or r.seq) - r.seq + 1 for r in resp.results)
    await call.done_writing()
    return await finish(call)


async def test_a_hook_declaring_stream_parts_sees_every_part_so_far(client: ProcessorClient) -> None:
    state = await _stream(client, "counting", 120)
    assert state["seen"] == list(range(1, 121))
    assert state["held"] == [True, True, True]


async def test_a_session_holds_no_part_for_a_hook_that_does_not_declare_them(client: ProcessorClient) -> None:
    state = await _stream(client, "plain", 120)
    assert state["held"] == [False, False, False]
