"""Backpressure inside a streamed run: a reader that does not read pauses the model stream
(`ChunkBuffer`), and a reader that leaves (`RunStream.detach`, `result`) lets the run go on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from procmesh_orchestrator.run.agent import Agent
from procmesh_orchestrator.run.base import TALLY
from procmesh_orchestrator.run.chunk_buffer import DEFAULT_LIMIT, ChunkBuffer
from procmesh_orchestrator.run.hooks import Chunk
from procmesh_orchestrator.run.models import ModelRequest
from tests.unit.orchestrator.run.fakes import FakeModel, agent

DELTAS = 2_000


class CountingModel(FakeModel):
    """Yields `DELTAS` deltas as fast as it is asked for them and counts what it yielded."""

    def __init__(self) -> None:
        super().__init__()
        self.yielded = 0

    async def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        for i in range(DELTAS):
            self.yielded += 1
            yield {"type": "text-delta", "payload": {"id": "t0", "text": f"{i} "}}
        yield {"type": "finish", "payload": {"finishReason": "stop", "usage": {}}}


async def settle() -> None:
    """Let the run go as far as it can (it never sleeps: only a full buffer stops it)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_a_reader_that_does_not_read_pauses_the_model_stream() -> None:
    model = CountingModel()
    stream = agent(model, []).stream("go")
    await settle()
    paused_at = model.yielded
    assert paused_at <= DEFAULT_LIMIT + 2  # start and step-start are put without waiting
    await settle()
    assert model.yielded == paused_at  # still paused: nothing was read

    texts = [c["payload"]["text"] async for c in stream if c["type"] == "text-delta"]
    assert texts == [f"{i} " for i in range(DELTAS)]  # every delta, in order, once read
    assert (await stream.result()).status == "success"


async def test_a_detached_run_goes_on_to_its_end_unread() -> None:
    model = CountingModel()
    stream = agent(model, []).stream("go")
    await settle()
    assert model.yielded < DELTAS
    stream.detach()
    result = await asyncio.wait_for(stream.result(), 10)
    assert model.yielded == DELTAS
    assert result.text == "".join(f"{i} " for i in range(DELTAS))


async def test_result_without_reading_consumes_the_chunks() -> None:
    stream = agent(CountingModel(), []).stream("go")
    result = await asyncio.wait_for(stream.result(), 10)
    assert result.finish_reason == "stop"


async def test_the_buffer_waits_for_room_and_keeps_order() -> None:
    buffer = ChunkBuffer(limit=2)
    buffer.put_nowait(1)
    await asyncio.wait_for(buffer.room(), 1)  # one of two: room
    assert not buffer.full
    buffer.put_nowait(2)
    assert buffer.full
    waiting = asyncio.ensure_future(buffer.room())
    await settle()
    assert not waiting.done()  # full: the producer waits
    assert await buffer.get() == 1
    await asyncio.wait_for(waiting, 1)  # a get made room
    assert not buffer.full
    assert await buffer.get() == 2
    getter = asyncio.ensure_future(buffer.get())
    await settle()
    assert not getter.done()
    buffer.put_nowait(3)
    assert await asyncio.wait_for(getter, 1) == 3


async def test_a_discarding_buffer_never_waits_and_keeps_only_the_last_item() -> None:
    buffer = ChunkBuffer(limit=1)
    buffer.put_nowait("a")
    buffer.discard()
    assert buffer.qsize() == 0
    for item in ("b", "c", "end"):
        buffer.put_nowait(item)
        await asyncio.wait_for(buffer.room(), 1)
    assert buffer.qsize() == 1
    assert await buffer.get() == "end"


def test_a_buffer_holds_at_least_one_chunk() -> None:
    with pytest.raises(ValueError, match="at least 1 chunk"):
        ChunkBuffer(limit=0)


def emitted(stream_agent: Agent, kind: str) -> float:
    return stream_agent.metrics.total("procmesh_stream_chunks_total", kind=kind)


async def test_every_chunk_of_an_output_stream_is_counted_though_per_batch() -> None:
    """The emitted-chunks metric is updated once per `TALLY` chunks of an output stream, and what
    is left at the stream's end: a run of deltas that is no multiple of it counts every one."""
    a = agent(CountingModel(), [])
    stream = a.stream("go")
    read = 0
    async for chunk in stream:
        read += chunk["type"] == "text-delta"
        if read == TALLY + 1:  # one batch counted, the next one not yet
            assert emitted(a, "text-delta") == TALLY
    await stream.result()
    assert DELTAS % TALLY
    assert emitted(a, "text-delta") == DELTAS
    assert emitted(a, "step-start") == 1  # outside the output stream: at once, as before
    assert emitted(a, "finish") == 1


async def test_the_chunks_of_a_cancelled_stream_are_counted() -> None:
    """A stream cut short counts what it emitted (the reader gets each of them) at its end."""
    a = agent(CountingModel(), [])
    stream = a.stream("go")
    chunks = aiter(stream)
    read = 0
    while read < 10:
        read += (await anext(chunks))["type"] == "text-delta"
    await settle()  # the run goes on until the buffer is full
    result = await asyncio.wait_for(stream.cancel(), 10)
    assert result.status != "success"
    read += sum([c["type"] == "text-delta" async for c in chunks])
    assert read < DELTAS
    assert read % TALLY
    assert emitted(a, "text-delta") == read
