"""The event log in this process's memory: the embedded default (one orchestrator, SQLite).

Per run, its fence (the highest epoch that wrote), a list of JSON-encoded chunks (so readers get
fresh dicts and a chunk that is not JSON fails here as it would on Redis) and an
`asyncio.Condition` that wakes live readers; retention is a `loop.call_later` that drops the run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from procmesh_orchestrator.durable.events.log import check, check_epoch, encode, fenced
from procmesh_orchestrator.errors import EventLogError, EventLogNotFoundError, EventLogUnavailableError


@dataclass(eq=False)
class _Run:
    events: list[str] = field(default_factory=list)
    finished: bool = False
    gone: bool = False
    """Expired (or the log closed): readers stop with `EventLogNotFoundError`."""
    epoch: int = 0
    """The fence: the highest epoch that wrote or was raised (`EventLog.fence`)."""
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    expiry: asyncio.TimerHandle | None = None


class MemoryEventLog:
    """Run logs in memory: nothing to install, gone with the process (so no takeover across replicas)."""

    name = "memory"

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._open = False
        self._wakers: set[asyncio.Task[None]] = set()
        """Expiry wake-ups in flight (held so they are not garbage-collected before they run)."""

    async def __aenter__(self) -> MemoryEventLog:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the log (nothing to connect to)."""
        self._open = True

    async def close(self) -> None:
        """Drop every run's log and cancel the retention timers; live readers stop (idempotent)."""
        self._open = False
        runs, self._runs = self._runs, {}
        for run in runs.values():
            await self._drop(run)

    def _run_to_write(self, run_id: str) -> _Run:
        """The run's log, made on its first write or fence (the log must be open)."""
        self._opened()
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run()
        return run

    async def ping(self) -> None:
        """Answer while open."""
        self._opened()

    async def append(
        self, run_id: str, offset: int, chunk: dict[str, Any], *, epoch: int | None = None
    ) -> bool:
        """Store `chunk` as event `offset`; False for an offset already in the log (see `EventLog`)."""
        data = encode(self.name, run_id, offset, chunk)
        check_epoch(self.name, run_id, epoch)
        run = self._run_to_write(run_id)
        self._pass_fence(run_id, run, epoch, f"event {offset}")
        if offset < len(run.events):
            return False
        if offset > len(run.events):
            raise EventLogError(
                f"event log {self.name}: run {run_id!r}: event {offset} would leave a gap "
                f"(the log holds {len(run.events)})"
            )
        if run.finished:
            raise EventLogError(f"event log {self.name}: run {run_id!r} is finished: no event {offset}")
        run.events.append(data)
        async with run.changed:
            run.changed.notify_all()
        return True

    async def next_offset(self, run_id: str) -> int:
        """How many events the run's log holds."""
        check(self.name, run_id, 0)
        self._opened()
        run = self._runs.get(run_id)
        return 0 if run is None else len(run.events)

    async def finish(self, run_id: str, retention_seconds: float, *, epoch: int | None = None) -> None:
        """Mark the log complete and drop it `retention_seconds` from now (again: restart the timer)."""
        check(self.name, run_id, 0)
        check_epoch(self.name, run_id, epoch)
        run = self._run_to_write(run_id)
        self._pass_fence(run_id, run, epoch, "finishing the log")
        run.finished = True
        if run.expiry is not None:
            run.expiry.cancel()
        loop = asyncio.get_running_loop()
        run.expiry = loop.call_later(max(0.0, retention_seconds), self._expire, run_id, run)
        async with run.changed:
            run.changed.notify_all()

    async def fence(self, run_id: str, epoch: int) -> int:
        """Raise the run's fence to `epoch` (never lower); the fence now."""
        check(self.name, run_id, 0)
        check_epoch(self.name, run_id, epoch)
        run = self._run_to_write(run_id)
        run.epoch = max(run.epoch, epoch)
        return run.epoch

    def _pass_fence(self, run_id: str, run: _Run, epoch: int | None, doing: str) -> None:
        """Refuse a write under an epoch below the run's fence; raise the fence to a higher one."""
        if epoch is None:
            return
        if epoch < run.epoch:
            raise fenced(self.name, run_id, epoch, run.epoch, doing)
        run.epoch = epoch

    async def read(
        self, run_id: str, offset: int = 0, *, poll: float = 1.0
    ) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """Every event from `offset` on, then the new ones, until the log is finished (see `EventLog`).

        `poll` is accepted for the contract's sake: a waiting reader here is woken by the append itself.
        """
        check(self.name, run_id, offset)
        self._opened()
        run = self._runs.get(run_id)
        if run is None:
            raise EventLogNotFoundError(f"event log {self.name}: run {run_id!r} has no log")
        position = offset
        while True:
            while position < len(run.events):
                yield position, json.loads(run.events[position])
                position += 1
            if run.gone:
                self._opened()
                raise EventLogNotFoundError(f"event log {self.name}: run {run_id!r}: its log expired")
            if run.finished:
                return
            async with run.changed:
                while not (run.gone or run.finished or position < len(run.events)):
                    await run.changed.wait()

    def _opened(self) -> None:
        if not self._open:
            raise EventLogUnavailableError(f"event log {self.name} is not started (or closed)")

    def _expire(self, run_id: str, run: _Run) -> None:
        if self._runs.get(run_id) is run:
            del self._runs[run_id]
        task = asyncio.get_running_loop().create_task(self._drop(run))
        self._wakers.add(task)
        task.add_done_callback(self._wakers.discard)

    @staticmethod
    async def _drop(run: _Run) -> None:
        if run.expiry is not None:
            run.expiry.cancel()
        run.gone = True
        async with run.changed:
            run.changed.notify_all()
