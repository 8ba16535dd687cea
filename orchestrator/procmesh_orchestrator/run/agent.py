"""`Agent`: generate() and stream() as in the seeds; `RunStream`: a streamed run's chunks and result."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from procmesh_orchestrator.errors import OrchestratorError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run.hooks import Chunk
from procmesh_orchestrator.run.loop import Run
from procmesh_orchestrator.run.types import AgentSpec, CallOptions, RunResult

_STREAM_END = object()


class RunStream:
    """A streamed run: iterate for chunks, then `await result()` (or await it directly)."""

    def __init__(self, run: Run, queue: asyncio.Queue[Any]) -> None:
        self._queue = queue
        self._run = run
        self._task = asyncio.create_task(self._drive())

    async def _drive(self) -> RunResult:
        try:
            result, _ = await self._run.execute()
            return result
        finally:
            self._queue.put_nowait(_STREAM_END)

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Chunk]:
        while True:
            item = await self._queue.get()
            if item is _STREAM_END:
                return
            yield item

    async def result(self) -> RunResult:
        """The run's result (consumes any chunks not yet read)."""
        return await self._task

    async def cancel(self) -> None:
        """Stop the run."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, OrchestratorError):
            await self._task


class Agent:
    """An agent bound to its processors: `generate()` and `stream()` as in the seeds."""

    def __init__(self, spec: AgentSpec, metrics: OrchestratorMetrics | None = None) -> None:
        self.spec = spec
        self.metrics = metrics or OrchestratorMetrics()

    async def generate(
        self, input: str | list[dict[str, Any]], options: CallOptions | None = None
    ) -> RunResult:
        """Run to completion. Raises `APICallError` or `ProcessorFailedError` when the run fails."""
        run = Run(self.spec, input, options or CallOptions(), sink=None, metrics=self.metrics)
        result, failure = await run.execute()
        if failure is not None:
            if isinstance(failure, OrchestratorError):
                failure.result = result  # what the run did before it failed (run id, steps, usage)
            raise failure
        return result

    def stream(self, input: str | list[dict[str, Any]], options: CallOptions | None = None) -> RunStream:
        """Start a streamed run; failures end the stream with an ``error`` chunk."""
        queue: asyncio.Queue[Any] = asyncio.Queue()
        run = Run(self.spec, input, options or CallOptions(), sink=queue.put_nowait, metrics=self.metrics)
        return RunStream(run, queue)
