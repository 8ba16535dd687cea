"""Where a run's failed model call ends: its next attempt begins with its next hook call.

A model call that fails gives up its attempt (`App.failed`, before the error processors are
asked): the model gateway cancels the judge questions its guards have in flight, and refuses
those they send after it (a window closed as the stream broke, a verdict task that woke late)
until the run's next attempt begins. That moment is the run's first hook call after the failure
other than the failure's own ``process_api_error``: a retry's or a fallback's output stream (or
its rehearsal), the next step's hooks, the run's end. `AttemptCaller` tells the App of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import TypeVar

from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors import GrpcHookCaller
from procmesh_orchestrator.processors.stream_rehearsal import StreamRehearsal
from procmesh_orchestrator.run.hooks import (
    APIErrorArgs,
    Attempt,
    Chunk,
    HookArgs,
    Processor,
    Reply,
    RunInfo,
    StreamItem,
)

R = TypeVar("R")

_FAILURE = APIErrorArgs.hook


class AttemptCaller(GrpcHookCaller):
    """A run's hook caller that tells `began` of each hook call but the failure's own."""

    def __init__(
        self, info: RunInfo, metrics: OrchestratorMetrics, began: Callable[[str], object] = lambda _: None
    ) -> None:
        # `began` has a default: a caller may be built again from its type with the base class's
        # arguments (a rehearsal's own caller, `StreamRehearsal`); the run's caller tells for it
        super().__init__(info, metrics)
        self._began = began

    async def call(self, item: Processor, args: HookArgs[R]) -> Reply[R]:
        """`GrpcHookCaller.call`, told."""
        if args.hook != _FAILURE:
            self._began(self.info.run_id)
        return await super().call(item, args)

    def send(
        self, group: Sequence[Processor], args: HookArgs[R], *, speculative: bool = False
    ) -> asyncio.Task[list[Attempt[R]]]:
        """`GrpcHookCaller.send`, told."""
        if args.hook != _FAILURE:
            self._began(self.info.run_id)
        return super().send(group, args, speculative=speculative)

    def stream(
        self, lane: Sequence[Processor], source: AsyncIterator[Chunk], *, announce_signals: bool
    ) -> AsyncGenerator[StreamItem, None]:
        """`GrpcHookCaller.stream`, told."""
        self._began(self.info.run_id)
        return super().stream(lane, source, announce_signals=announce_signals)

    def rehearse(
        self, lane: Sequence[Processor], source: AsyncIterator[Chunk], *, announce_signals: bool
    ) -> StreamRehearsal:
        """`GrpcHookCaller.rehearse`, told."""
        self._began(self.info.run_id)
        return super().rehearse(lane, source, announce_signals=announce_signals)
