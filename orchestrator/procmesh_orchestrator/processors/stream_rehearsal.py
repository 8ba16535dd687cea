"""An output lane run ahead on a guess of its stream, everything it gives held (`StreamRehearsal`).

The optimistic first step (`run.optimistic`) starts step 0's model call while the input
processors still run; a rehearsal runs the step's output lane on that call's chunks at once,
so its processors do their slow part (a guard asks the judge about each window) while the input
guards judge. It is the step's own output pipeline, with three things held back until the run
adopts it (`adopt`), when every input processor has committed and step 0's model request is the
one the early call made:

- what comes out (parts, effects, the abort or the failure that ends it): kept in order, and
  handed to the run as the stream would have handed them, then the rest as it comes;
- the processor states its sessions end with: written to its own copy of the run's states, and
  into the run's at adoption (after it, straight into the run's);
- its metrics: counted on its own `OrchestratorMetrics` and added to the run's when the adopted
  stream ends (a rehearsal counts nothing anywhere a scrape reads before that).

It is adopted only when every session it opened would open the same way now (`stands`: the
same `RunContext`, so the same state, options, request context, message sources, step and
retry): the processors answered exactly what they would answer now. Otherwise, or when the
early call is discarded, it is cancelled (`cancel`) and nothing of it reaches the run; its
processors are speculative ones, so calls withdrawn change nothing. Its hook spans (and the
sidecars' under them) start when it does, before step 0's span: they stay in the trace either
way, under the run's span.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Histogram

from procmesh.v1 import types_pb2 as tpb
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.processors.stream_call import HOOK
from procmesh_orchestrator.run.hooks import Chunk, Processor, StreamItem

if TYPE_CHECKING:
    from procmesh_orchestrator.processors.calls import GrpcHookCaller


class HeldStates(dict[str, object]):
    """A run's processor states as a rehearsal sees them: a copy its sessions write to, whose
    writes go into the run's states once it is adopted (and straight there after it)."""

    def __init__(self, states: dict[str, object]) -> None:
        super().__init__(states)
        self._written: set[str] = set()
        self._into: dict[str, object] | None = None

    def __setitem__(self, key: str, value: object) -> None:
        super().__setitem__(key, value)
        if self._into is None:
            self._written.add(key)
        else:
            self._into[key] = value

    def adopt(self, into: dict[str, object]) -> None:
        for key in self._written:
            into[key] = self[key]
        self._into = into


class StreamRehearsal:
    """The output pipeline of `lane` on `source`, started now, its items held until `adopt`."""

    def __init__(
        self,
        caller: GrpcHookCaller,
        lane: Sequence[Processor],
        source: AsyncIterator[Chunk],
        *,
        announce_signals: bool,
    ) -> None:
        self._run = caller
        info = caller.info
        self._states = HeldStates(info.states)
        own = dataclasses.replace(
            info, states=self._states, message_sources=dict(info.message_sources), decisions=None
        )
        self._metrics = OrchestratorMetrics()
        rehearsing = type(caller)(own, self._metrics)
        self._handles = [p for p in lane if isinstance(p, ProcessorHandle) and p.has(HOOK)]
        self._opened = _openings(rehearsing, self._handles)
        self._items: list[StreamItem] = []
        self._failure: Exception | None = None
        self._ended = False
        self._adopted = False
        self._stream = rehearsing.stream(lane, source, announce_signals=announce_signals)
        self._task = asyncio.create_task(self._hold())

    async def _hold(self) -> None:
        """Take the pipeline's items as they come, until it ends or the run adopts it."""
        try:
            async for item in self._stream:
                self._items.append(item)
                if self._adopted:  # the run reads on from here, at its own pace
                    return
        except Exception as exc:  # the stream's failure (fail-closed, the source's): held too
            self._failure = exc
        self._ended = True

    def stands(self) -> bool:
        """Whether every session it opened would open the same way now (then its answers stand)."""
        return _openings(self._run, self._handles) == self._opened

    async def adopt(self) -> AsyncGenerator[StreamItem, None]:
        """The held items in order, then the rest as the stream gives them (its failure raised);
        its states are the run's from now on, its metrics added to the run's at the end."""
        self._adopted = True
        self._states.adopt(self._run.info.states)
        try:
            i = 0
            while True:
                while i < len(self._items):
                    yield self._items[i]
                    i += 1
                if self._task.done():
                    break
                await asyncio.wait({self._task})  # its last read ends with an item, or the stream
            self._items.clear()
            if self._failure is not None:
                raise self._failure
            if not self._ended:
                async for item in self._stream:
                    yield item
        finally:
            await self.cancel()
            _add_counts(self._metrics, self._run.metrics)

    async def cancel(self) -> None:
        """Stop it: its sessions are cancelled, nothing more of it is held or handed on."""
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stream.aclose()


def _openings(caller: GrpcHookCaller, handles: list[ProcessorHandle]) -> list[bytes]:
    """The `RunContext` each of `handles` would open its session with, as sent."""
    out = []
    for handle in handles:
        ctx = tpb.RunContext()
        caller.fill_context(ctx, handle)
        ctx.state.SetInParent()  # no state is an empty one, as the processor reads it
        out.append(ctx.SerializeToString(deterministic=True))
    return out


def _add_counts(held: OrchestratorMetrics, metrics: OrchestratorMetrics) -> None:
    """Add every labelled counter and histogram series `held` counted to the same in `metrics`
    (what an output stream counts: calls, parts, their added latency, speculative outcomes)."""
    for name, family in vars(held).items():
        if not isinstance(family, Counter | Histogram) or not family._labelnames:
            continue
        target: Any = getattr(metrics, name)
        children: dict[Any, Any] = family._metrics
        for labels, child in children.items():
            into = target.labels(*labels)
            if isinstance(family, Counter):
                if value := child._value.get():
                    into.inc(value)
                continue
            into._sum.inc(child._sum.get())
            for mine, theirs in zip(into._buckets, child._buckets, strict=True):
                if n := theirs.get():
                    mine.inc(n)
