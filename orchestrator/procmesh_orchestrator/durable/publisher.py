"""A durable run's chunks on their way into its event log (`Publisher`), under the run's epoch."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from procmesh_orchestrator.durable.events import EventLog
from procmesh_orchestrator.errors import EventLogError, EventLogFencedError, EventLogUnavailableError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run.base import ChunkSink
from procmesh_orchestrator.run.hooks import Chunk

log = logging.getLogger(__name__)

_END = object()
_RETRY_PAUSE = 0.5
"""Seconds between attempts while the event log is unreachable (the run pauses at its next
checkpoint until it is back)."""


class Publisher:
    """A run's chunks into its event log, in order, each appended before any client can read it,
    under the run's epoch (a log whose fence moved on refuses them: `on_fenced`).

    The run's sink is synchronous; a task appends what it queues. While the log is unreachable
    the task retries (logged once per outage), so the run pauses at its next checkpoint, which
    waits for the queue to drain.
    """

    def __init__(
        self, events: EventLog, run_id: str, offset: int, epoch: int, metrics: OrchestratorMetrics
    ) -> None:
        self.events = events
        self.run_id = run_id
        self.next_offset = offset
        self.epoch = epoch
        self.metrics = metrics
        self.dropped = False
        """Set when the run lost its lease (or the log refused it): nothing more is published."""
        self.failure: EventLogError | None = None
        """Why the log refused a chunk, if it did (the run is then recorded as failed)."""
        self.on_fenced: Callable[[EventLogFencedError], None] = lambda exc: None
        """Told when the log refused a chunk for the run's epoch (another replica has the run)."""
        self.opened = asyncio.Event()
        """Set once the log holds the run's first chunk: from then on a client can attach."""
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.create_task(self._pump())

    def put(self, chunk: Chunk) -> None:
        if not self.dropped:
            self.metrics.event_log_lag.inc()
            self._queue.put_nowait(chunk)

    async def _pump(self) -> None:
        while True:
            chunk = await self._queue.get()
            try:
                if chunk is _END:
                    return
                await self._append(chunk)
            except EventLogFencedError as exc:  # another replica has the run: it publishes
                self.dropped = True
                self.on_fenced(exc)
            except EventLogError as exc:  # refused (not unreachable): a bug, never papered over
                log.error("run %s: the event log refused a chunk: %s", self.run_id, exc)
                self.failure = exc
                self.dropped = True
            finally:
                self._queue.task_done()

    async def _append(self, chunk: Chunk) -> None:
        if self.dropped:
            return
        outage = False
        while not self.dropped:
            try:  # False: already there
                await self.events.append(self.run_id, self.next_offset, chunk, epoch=self.epoch)
                break
            except EventLogUnavailableError as exc:
                if not outage:
                    log.warning("run %s: event log unreachable, the run waits for it: %s", self.run_id, exc)
                    outage = True
                await asyncio.sleep(_RETRY_PAUSE)
        self.next_offset += 1
        self.opened.set()
        self.metrics.event_log_lag.dec()

    async def flush(self) -> None:
        """Wait until everything queued is in the log."""
        await self._queue.join()

    async def close(self) -> None:
        self._queue.put_nowait(_END)
        await self._task

    def drop(self) -> None:
        """The lease is gone: stop publishing at once (the replica that has the run publishes)."""
        self.dropped = True
        self._task.cancel()


def without_start(sink: ChunkSink) -> ChunkSink:
    """`sink` without the resumed run's own start chunk: published at the checkpoint's offset, it
    would take the place of the step's first chunk and shift every later one by one (the log then
    refuses the shifted chunks it holds and adds the rest a place too late: one twice, one late)."""
    seen = False

    def put(chunk: Chunk) -> None:
        nonlocal seen
        if not seen and chunk.get("type") == "start":
            seen = True
            return
        sink(chunk)

    return put
