"""Durable runs: checkpointed at every step boundary, leased to one replica, taken over when it dies.

A durable run's row in the store holds its snapshot and a lease (the replica that runs it, until
when); its chunks go to an event log with offsets before any client sees them. The replica
renews the lease while the run goes on and stops the run itself before a lease it could not
renew expires, so no two replicas ever run it at once. Every replica claims runs whose lease
expired (the database's locking decides who) and continues each from its last snapshot:
processInput does not run again; the interrupted step's model call (and tools) may. Chunks the
dead replica already published are not published again (the log refuses an offset it holds), and
memory is saved once, at the run's end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from procmesh_orchestrator.errors import (
    EventLogError,
    EventLogUnavailableError,
    LeaseLostError,
    MemoryStoreError,
    OrchestratorError,
    SuspendError,
)
from procmesh_orchestrator.events import EventLog
from procmesh_orchestrator.memory.store import CANCELLED, DONE, FAILED, SUSPENDED, DurableRun, MemoryStore
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import AgentSpec, CallOptions, RunResult, snapshot
from procmesh_orchestrator.run.base import ChunkSink, RunCore
from procmesh_orchestrator.run.hooks import Chunk
from procmesh_orchestrator.run.loop import Run

log = logging.getLogger(__name__)

_END = object()
_KEEP_ENDED = 256
_RETRY_PAUSE = 0.5
"""Seconds between attempts while the event log is unreachable (the run pauses at its next
checkpoint until it is back)."""


@dataclass(frozen=True)
class DurableSettings:
    """How long a lease lasts, how often replicas look for runs to take over, how long logs live."""

    lease_seconds: float = 10.0
    claim_interval_seconds: float = 2.0
    retention_seconds: float = 86_400.0
    max_runs: int = 64
    """Runs this replica runs at once (its own and those it takes over)."""


def replica_id() -> str:
    """This process's name in leases: host, pid and a random part (a restarted pod is another)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class _Publisher:
    """A run's chunks into its event log, in order, each appended before any client can read it.

    The run's sink is synchronous; a task appends what it queues. While the log is unreachable
    the task retries (logged once per outage), so the run pauses at its next checkpoint, which
    waits for the queue to drain.
    """

    def __init__(self, events: EventLog, run_id: str, offset: int, metrics: OrchestratorMetrics) -> None:
        self.events = events
        self.run_id = run_id
        self.next_offset = offset
        self.metrics = metrics
        self.dropped = False
        """Set when the run lost its lease (or the log refused it): nothing more is published."""
        self.failure: EventLogError | None = None
        """Why the log refused a chunk, if it did (the run is then recorded as failed)."""
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
            try:
                await self.events.append(self.run_id, self.next_offset, chunk)  # False: already there
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


@dataclass
class _Local:
    """A durable run this replica runs."""

    run: Run
    publisher: _Publisher
    task: asyncio.Task[RunResult | None]


class DurableRuns:
    """This replica's durable runs, and the take-over of others' whose lease expired."""

    def __init__(
        self,
        store: Callable[[], Awaitable[MemoryStore]],
        events: EventLog,
        agents: Mapping[str, AgentSpec],
        metrics: OrchestratorMetrics,
        settings: DurableSettings | None = None,
        replica: str | None = None,
    ) -> None:
        self._open_store = store
        self.events = events
        self.agents = agents
        self.metrics = metrics
        self.settings = settings or DurableSettings()
        self.replica = replica or replica_id()
        self.local: dict[str, _Local] = {}
        self._ended: OrderedDict[str, asyncio.Task[RunResult | None]] = OrderedDict()
        """The last runs that ended here, for `result` (a run may end before its caller asks)."""
        self._claimer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start looking for runs to take over."""
        await self._open_store()
        self._claimer = asyncio.create_task(self._claim_loop())

    async def close(self) -> None:
        """Stop taking runs over and stop the local ones without finishing them: their leases
        expire and another replica continues each from its last checkpoint."""
        if self._claimer is not None:
            self._claimer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._claimer
        for local in list(self.local.values()):
            local.publisher.drop()
            local.task.cancel()
        for local in list(self.local.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await local.task

    # -- starting, attaching, cancelling -----------------------------------------------------

    async def begin(self, agent_id: str, input: str | list[dict[str, Any]], options: CallOptions) -> str:
        """Start a durable run of `agent_id`; its id (attach to it with `attach`)."""
        spec = self.agents[agent_id]
        if options.abort_signal is None:
            options = replace(options, abort_signal=asyncio.Event())
        data = {"phase": "start", "input": input, "call": snapshot.call_data(options)}
        run_id = str(uuid.uuid4())
        store = await self._open_store()
        await store.create_durable_run(
            DurableRun(
                run_id=run_id,
                agent_id=agent_id,
                thread_id=options.thread_id,
                resource_id=options.resource_id,
                snapshot=data,
            ),
            owner=self.replica,
            lease_seconds=self.settings.lease_seconds,
        )

        def build(sink: ChunkSink) -> Run:
            return Run(spec, input, options, sink=sink, metrics=self.metrics, run_id=run_id)

        try:
            local = self._launch(run_id, 0, build)
        except BaseException as exc:
            await store.finish_durable_run(run_id, owner=self.replica, status=FAILED, error=str(exc))
            raise
        # A client attaches as soon as this returns: the log must exist by then (its `start`).
        opened = asyncio.ensure_future(local.publisher.opened.wait())
        await asyncio.wait({opened, local.task}, return_when=asyncio.FIRST_COMPLETED)
        opened.cancel()
        return run_id

    def attach(self, run_id: str, offset: int = 0) -> AsyncIterator[tuple[int, Chunk]]:
        """Every chunk of the run from `offset` on, live or after it ended (any replica)."""
        return self.events.read(run_id, offset)

    async def result(self, run_id: str) -> RunResult | None:
        """The result of a run this replica runs or lately ran (None when it stopped here without
        one: another replica has it, or it ran here too long ago)."""
        local = self.local.get(run_id)
        if local is not None:
            return await asyncio.shield(local.task)
        ended = self._ended.get(run_id)
        return None if ended is None or ended.cancelled() else ended.result()

    async def cancel(self, run_id: str) -> DurableRun:
        """Ask the run to stop: at once when it runs here, else at its replica's next renewal."""
        store = await self._open_store()
        record = await store.request_durable_cancel(run_id)
        local = self.local.get(run_id)
        if local is not None and local.run.options.abort_signal is not None:
            local.run.options.abort_signal.set()
        return record

    # -- running -----------------------------------------------------------------------------

    def _launch(self, run_id: str, offset: int, build: Callable[[ChunkSink], Run]) -> _Local:
        """Run it here: its chunks go to the log from `offset` on, its checkpoints to the store."""
        publisher = _Publisher(self.events, run_id, offset, self.metrics)
        try:
            run = build(publisher.put)
        except BaseException:
            publisher.drop()
            raise
        run.checkpoint = self._checkpointer(publisher)
        task = asyncio.create_task(self._drive(run, publisher))
        local = self.local[run_id] = _Local(run, publisher, task)
        task.add_done_callback(lambda done: self._forget(run_id, done))
        return local

    def _forget(self, run_id: str, task: asyncio.Task[RunResult | None]) -> None:
        self.local.pop(run_id, None)
        self._ended[run_id] = task
        while len(self._ended) > _KEEP_ENDED:
            self._ended.popitem(last=False)

    def _checkpointer(self, publisher: _Publisher) -> Callable[[RunCore, int], Awaitable[None]]:
        async def checkpoint(run: RunCore, next_step: int) -> None:
            await publisher.flush()  # the snapshot's offset never runs ahead of the log
            data = snapshot.capture(run, next_step=next_step)
            data["phase"] = "step"
            data["eventOffset"] = publisher.next_offset
            store = await self._open_store()
            try:
                await store.checkpoint_durable_run(
                    run.run_id, owner=self.replica, snapshot=data, lease_seconds=self.settings.lease_seconds
                )
            except LeaseLostError:
                publisher.drop()  # the replica that has it now publishes; not even our error chunk
                raise

        return checkpoint

    async def _drive(self, run: Run, publisher: _Publisher) -> RunResult | None:
        keeper = asyncio.create_task(self._keep_lease(run))
        try:
            work = asyncio.create_task(run.execute())
            done, _ = await asyncio.wait({work, keeper}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:  # the lease is lost: another replica has (or will have) the run
                publisher.drop()
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                return None
            result, failure = work.result()
            if publisher.dropped and publisher.failure is None:
                return None  # a checkpoint found the lease gone: the run is another replica's
            await publisher.close()
            status, error = _STATUS[result.status], str(failure or "")
            if publisher.failure is not None:
                status, error = FAILED, f"the event log refused a chunk: {publisher.failure}"
            store = await self._open_store()
            # The record first: a reader that sees the log end finds the run's final status.
            await store.finish_durable_run(run.run_id, owner=self.replica, status=status, error=error)
            await self.events.finish(run.run_id, self.settings.retention_seconds)
            return result
        except LeaseLostError:
            publisher.drop()
            return None
        except asyncio.CancelledError:
            publisher.drop()
            raise
        except OrchestratorError as exc:  # the store or the log failed at the very end: the lease
            log.warning("run %s could not be recorded as finished: %s", run.run_id, exc)  # decides
            publisher.drop()
            return None
        finally:
            keeper.cancel()

    async def _keep_lease(self, run: Run) -> None:
        """Renew the lease until the run ends; return (the run must stop) when it is lost, or when
        renewals failed so long that it would expire before the next try."""
        lease = self.settings.lease_seconds
        held_until = time.monotonic() + lease
        while True:
            await asyncio.sleep(lease / 3)
            try:
                # A store that is down makes a renewal wait out the store's own timeout (its pool's,
                # 5 s by default), which may be longer than the lease: give up in time to stop here
                # before the lease expires.
                async with asyncio.timeout(max(0.0, held_until - lease / 6 - time.monotonic())):
                    store = await self._open_store()
                    cancel = await store.renew_durable_lease(
                        run.run_id, owner=self.replica, lease_seconds=lease
                    )
            except LeaseLostError:
                log.warning("run %s: its lease was taken over; stopping here", run.run_id)
                return
            except (MemoryStoreError, TimeoutError) as exc:
                self.metrics.lease_renewals_failed.inc()
                if time.monotonic() + lease / 3 >= held_until - lease / 6:
                    log.warning(
                        "run %s: cannot renew its lease (%s); stopping before it expires",
                        run.run_id,
                        exc or "no answer in time",
                    )
                    return
                continue
            held_until = time.monotonic() + lease
            if cancel and run.options.abort_signal is not None:
                run.options.abort_signal.set()

    # -- taking over -------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.claim_interval_seconds)
            room = self.settings.max_runs - len(self.local)
            if room <= 0:
                continue
            try:
                store = await self._open_store()
                claimed = await store.claim_expired_durable_runs(
                    owner=self.replica, lease_seconds=self.settings.lease_seconds, limit=room
                )
            except MemoryStoreError as exc:
                log.warning("cannot look for durable runs to take over: %s", exc)
                continue
            for record in claimed:
                try:
                    self._take_over(record)
                except SuspendError as exc:  # a processor list naming what this replica lacks
                    log.warning("run %s could not be taken over: %s", record.run_id, exc)
                    await store.finish_durable_run(
                        record.run_id, owner=self.replica, status=FAILED, error=f"could not be resumed: {exc}"
                    )
                except Exception:  # a run this replica cannot run (an unknown agent, a bad snapshot)
                    log.exception("run %s could not be taken over", record.run_id)
                    await store.finish_durable_run(
                        record.run_id, owner=self.replica, status=FAILED, error="could not be resumed"
                    )

    def _take_over(self, record: DurableRun) -> None:
        spec = self.agents[record.agent_id]
        data = record.snapshot
        options = CallOptions(abort_signal=asyncio.Event())
        run_id = record.run_id
        build: Callable[[ChunkSink], Run]
        if data.get("phase") == "start":  # it died before its first checkpoint: from the start
            call = data["call"]
            options = snapshot.resumed_options(call, replace(options, timeout=call["timeout"]), spec)

            def build(sink: ChunkSink) -> Run:
                return Run(spec, data["input"], options, sink=sink, metrics=self.metrics, run_id=run_id)

            offset = 0
        else:

            def build(sink: ChunkSink) -> Run:
                sink = _without_start(sink)  # the log's offset 0 is the run's start already
                return Run.resume(spec, data, None, options, sink=sink, metrics=self.metrics)

            offset = int(data["eventOffset"])
        self.metrics.runs_taken_over.inc()
        log.info(
            "run %s taken over (attempt %d) at step %s", run_id, record.attempts, data.get("nextStep", 0)
        )
        self._launch(run_id, offset, build)


def _without_start(sink: ChunkSink) -> ChunkSink:
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


_STATUS = {
    "success": DONE,
    "tripwire": DONE,
    "failed": FAILED,
    "aborted": CANCELLED,
    "suspended": SUSPENDED,
}
"""A run's status as its durable record keeps it."""
