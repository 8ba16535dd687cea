"""The output-stream pipeline: every output processor's ProcessOutputStream session, in lane order.

Parts stay protobuf from the first stage to the last; what a stage's processor did besides its
part (signals, violations) travels down in stream order as data (`StreamEffects`), and a
processor's abort as the last item. Consecutive speculative processors on different sidecars
run as one `SpeculativeGroup` (every part goes to all of them at once); any other session is a
`PlainStage`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterable
from typing import TYPE_CHECKING, Any

from procmesh import convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.processors.lanes import ParallelGroup, ProcessorHandle, RunLaneItem
from procmesh_orchestrator.processors.speculative_stream import SpeculativeGroup
from procmesh_orchestrator.processors.stream_call import (
    ABORT,
    CHUNK,
    EFFECTS,
    END,
    ERROR,
    HOOK,
    MAX_BATCH,
    Pipe,
)
from procmesh_orchestrator.processors.stream_plan import may_follow, speculative_groups
from procmesh_orchestrator.processors.stream_stage import PlainStage
from procmesh_orchestrator.run.hooks import StreamItem

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.calls import GrpcHookCaller


def _to_proto(chunk: dict[str, Any], out: tpb.Chunk) -> None:
    """`convert.chunk_to_proto` into `out`, a text delta (nearly every part of a stream) inline."""
    if chunk["type"] == "text-delta":
        payload = chunk.get("payload") or {}
        out.type = "text-delta"
        delta = out.text_delta
        delta.text = payload.get("text", "")
        delta.id = payload.get("id", "")
    else:
        convert.chunk_to_proto(chunk, out)


RECOUNT = 32
"""Parts the pipeline's source puts, at most, between two counts of what waits in its pipes
(`OutputPipeline.run`: a count at every part was 4% of a 1,000-delta run's CPU)."""

ARENA_BLOCK = 64
"""Parts a run converts into one message's ``repeated Chunk`` (one upb arena) before starting the
next. A standalone `tpb.Chunk` costs about 0.9 KB outside Python's heap (its own arena, and the
table its wrapper keeps for the submessages set through it); parts made in a shared arena, each
travelling as a fresh wrapper, about 0.3 KB. A block is freed when its last part is (a speculative
group keeps a run's committed parts to the end anyway, `Member.replay`)."""


class OutputPipeline:
    """Runs chunks through every output processor's process_output_stream, in lane order.

    Stages are pipelined (chunk n+1 can be at the first processor while chunk n
    is at the second) and each stage batches whatever is queued into one stream
    message; per-chunk semantics (emit, replace, drop, abort) stay exact.
    """

    def __init__(
        self, caller: GrpcHookCaller, items: Iterable[RunLaneItem], *, announce_signals: bool
    ) -> None:
        self.caller = caller
        self.announce_signals = announce_signals
        # A parallel group streams as its branches in a row: the others see each part as it came
        # (their verdicts and chunks apply, their output does not), then the picked branch.
        stages: list[tuple[ProcessorHandle, bool]] = []
        for item in items:
            if isinstance(item, ParallelGroup):
                picked = item.branches[item.pick]
                stages += [(b, True) for b in item.branches if b is not picked]
                stages.append((picked, False))
            else:
                stages.append((item, False))
        stages = [(h, side) for h, side in stages if h.has(HOOK)]
        # neighbours of one sidecar that runs fused requests share a session
        sessions: list[tuple[list[ProcessorHandle], bool]] = []
        for handle, side in stages:
            last = sessions[-1] if sessions else None
            if (
                caller.info.fuse
                and last is not None
                and not side
                and not last[1]
                and handle.fuse_key
                and handle.fuse_key == last[0][-1].fuse_key
                and may_follow(last[0], handle)
            ):
                last[0].append(handle)
            else:
                sessions.append(([handle], side))
        self.stages = speculative_groups(sessions)

    async def run(self, source: AsyncIterator[dict[str, Any]]) -> AsyncGenerator[StreamItem, None]:
        """Feed `source` through the stages; yield chunks and effects, and the abort that ends it."""
        if not self.stages:
            async for chunk in source:
                yield chunk
            return
        taken = asyncio.Event()
        queues = [Pipe(taken) for _ in range(len(self.stages) + 1)]
        stages: list[PlainStage | SpeculativeGroup] = []
        for i, (planned, side) in enumerate(self.stages):
            inq, outq = queues[i], queues[i + 1]
            if side is None:  # consecutive speculative sessions
                stages.append(
                    SpeculativeGroup(self.caller, planned, inq, outq, announce_signals=self.announce_signals)
                )
            else:
                stages.append(
                    PlainStage(
                        self.caller, planned[0], inq, outq, announce_signals=self.announce_signals, side=side
                    )
                )

        async def produce() -> None:
            block = ARENA_BLOCK
            first = queues[0]
            room = 0  # parts it may put before it counts what waits again
            try:
                async for chunk in source:
                    if block == ARENA_BLOCK:  # a new block (`ARENA_BLOCK`)
                        parts, block = ppb.ProcessLLMResponseRequest().chunks, 0
                    _to_proto(chunk, parts.add())  # filled through a wrapper dropped here:
                    first.put_nowait((CHUNK, parts[block]))  # a fresh one travels
                    block += 1
                    room -= 1
                    # The run's reader is behind (or a stage is): the model stream waits too. What
                    # waits is counted once the room last counted is used up, and at least every
                    # `RECOUNT` parts (the stages may hand on more meanwhile, at the source's
                    # awaits), not at every part: it passes `MAX_BATCH` by fewer than `RECOUNT`.
                    while room <= 0:
                        room = min(MAX_BATCH - sum(map(len, queues)), RECOUNT)
                        if room > 0:
                            break
                        taken.clear()
                        await taken.wait()
            except Exception as exc:  # the source's failure travels behind the chunks before it
                queues[0].put_nowait((ERROR, exc))
                return
            queues[0].put_nowait((END, None))

        async def guard(coro: Awaitable[None]) -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # a stage's own bug ends the stream instead of hanging it
                queues[-1].put_nowait((ERROR, exc))

        tasks = [asyncio.create_task(guard(produce()))]
        tasks += [asyncio.create_task(guard(stage.feed())) for stage in stages]
        try:
            while True:
                for kind, value in await queues[-1].get():
                    if kind == CHUNK:
                        yield convert.chunk_from_proto(value)
                    elif kind == EFFECTS:
                        yield value
                    elif kind == END:
                        return
                    elif kind == ABORT:
                        yield value
                        return
                    else:
                        raise value
        finally:
            for stage in stages:
                tasks += stage.shutdown()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for stage in stages:
                stage.release()
