"""`DurableRuns`: this replica's durable runs, each checkpointed, leased and fenced by its epoch."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from procmesh_orchestrator.durable.config import DurableConfig
from procmesh_orchestrator.durable.events import EventLog
from procmesh_orchestrator.durable.publisher import Publisher
from procmesh_orchestrator.durable.takeover import TakeOver
from procmesh_orchestrator.errors import (
    EventLogError,
    EventLogFencedError,
    EventLogUnavailableError,
    FencedWriteError,
    LeaseLostError,
    MemoryStoreError,
    OrchestratorError,
)
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import AgentSpec, CallOptions, RunResult, snapshot
from procmesh_orchestrator.run.base import ChunkSink, RunCore
from procmesh_orchestrator.run.hooks import Chunk
from procmesh_orchestrator.run.loop import Run
from procmesh_orchestrator.store import (
    CANCELLED,
    DONE,
    FAILED,
    SUSPENDED,
    DurableRun,
    MemoryStore,
    RunFence,
    client_message,
)

log = logging.getLogger("procmesh_orchestrator.durable")

_KEEP_ENDED = 256


def replica_id() -> str:
    """This process's name in leases: host, pid and a random part (a restarted pod is another)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def config_version(agent_config: Any) -> str:
    """The fingerprint of an agent's configuration (a pydantic model, or any JSON-able value): the
    first 16 hex digits of the SHA-256 of its canonical JSON. Runs carry the one they started
    under; a replica taking one over under another says so."""
    dump = getattr(agent_config, "model_dump_json", None)
    text = dump(by_alias=True) if dump is not None else repr(agent_config)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class _Local:
    """A durable run this replica runs, at the epoch its claim (or creation) gave it."""

    agent_id: str
    run: Run
    publisher: Publisher
    epoch: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at the first write refused for the epoch: the run stops here at once."""
    task: asyncio.Task[RunResult | None] | None = None


class DurableRuns(TakeOver):
    """This replica's durable runs, and the take-over of others' whose lease expired."""

    def __init__(
        self,
        store: Callable[[], Awaitable[MemoryStore]],
        events: EventLog,
        agents: Mapping[str, AgentSpec],
        metrics: OrchestratorMetrics,
        settings: DurableConfig | None = None,
        replica: str | None = None,
        versions: Mapping[str, str] | None = None,
        ended: list[Callable[[str, RunResult], None]] | None = None,
    ) -> None:
        self._open_store = store
        self.events = events
        self.agents = agents
        """The agents this replica runs: it claims runs of these only."""
        self.versions = dict(versions or {})
        """Each agent's config fingerprint (`config_version`), kept in the runs it starts."""
        self.metrics = metrics
        self.ended = ended if ended is not None else []
        """Told (agent id, result) of each run that ends on this replica with its result recorded:
        begun here or taken over from another (the replica that ends a run tells, once). The
        App's `durable_ended`, shared: a listener added to it later is told too."""
        self.settings = settings or DurableConfig()
        """The configuration's ``durable`` section: leases, take-over, the event log's retention."""
        self.replica = replica or replica_id()
        self.local: dict[str, _Local] = {}
        self._ended: OrderedDict[str, asyncio.Task[RunResult | None]] = OrderedDict()
        """The last runs that ended here, for `result` (a run may end before its caller asks)."""
        self._left: OrderedDict[str, str] = OrderedDict()
        """Runs left to other replicas (run id: why), each counted once; those it could not resume
        (``resume``) are not claimed again here."""
        self._left_logged = -math.inf
        self._left_after: str | None = None
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
            if local.task is not None:
                local.task.cancel()
        for local in list(self.local.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                if local.task is not None:
                    await local.task

    # -- starting, attaching, cancelling -----------------------------------------------------

    async def begin(self, agent_id: str, input: str | list[dict[str, Any]], options: CallOptions) -> str:
        """Start a durable run of `agent_id`; its id (attach to it with `attach`)."""
        spec = self.agents[agent_id]
        if options.abort_signal is None:
            options = replace(options, abort_signal=asyncio.Event())
        data = {"phase": "start", "input": input, "call": snapshot.call_data(options)}
        run_id = options.run_id or str(uuid.uuid4())
        store = await self._open_store()
        created = await store.create_durable_run(
            DurableRun(
                run_id=run_id,
                agent_id=agent_id,
                thread_id=options.thread_id,
                resource_id=options.resource_id,
                snapshot=data,
                config_version=self.versions.get(agent_id, ""),
            ),
            owner=self.replica,
            lease_seconds=self.settings.lease_seconds,
        )

        def build(sink: ChunkSink) -> Run:
            return Run(spec, input, options, sink=sink, metrics=self.metrics, run_id=run_id)

        try:
            local = self._launch(agent_id, run_id, 0, created.epoch, build)
        except BaseException as exc:
            await store.finish_durable_run(
                run_id, owner=self.replica, epoch=created.epoch, status=FAILED, error=_shown(exc)
            )
            raise
        # A client attaches as soon as this returns: the log must exist by then (its `start`).
        assert local.task is not None
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
        if local is not None and local.task is not None:
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

    def _launch(
        self, agent_id: str, run_id: str, offset: int, epoch: int, build: Callable[[ChunkSink], Run]
    ) -> _Local:
        """Run it here at `epoch`: its chunks go to the log from `offset` on, its checkpoints to
        the store, each write under the epoch."""
        publisher = Publisher(self.events, run_id, offset, epoch, self.metrics)
        try:
            run = build(publisher.put)
        except BaseException:
            publisher.drop()
            raise
        local = _Local(agent_id, run, publisher, epoch)
        run.fence = RunFence(run_id, epoch)
        run.on_fenced = lambda write, exc: self._fenced(local, write, exc)
        publisher.on_fenced = lambda exc: self._fenced(local, "event", exc)
        run.checkpoint = self._checkpointer(local)
        task = local.task = asyncio.create_task(self._drive(local))
        self.local[run_id] = local
        task.add_done_callback(lambda done: self._forget(run_id, done))
        return local

    def _forget(self, run_id: str, task: asyncio.Task[RunResult | None]) -> None:
        self.local.pop(run_id, None)
        self._ended[run_id] = task
        while len(self._ended) > _KEEP_ENDED:
            self._ended.popitem(last=False)

    def _fenced(self, local: _Local, write: str, exc: BaseException) -> None:
        """A write of the run under its epoch was refused: another replica claimed the run since.
        Counted; the first is logged and stops the run here (nothing more is published)."""
        self.metrics.fenced_writes.labels(write).inc()
        if local.stop.is_set():
            return
        local.stop.set()
        local.publisher.drop()
        current = getattr(exc, "current", None)
        log.warning(
            "run %s: its %s under epoch %d was refused: the run is at epoch %s, another replica "
            "took it over while this one held an expired lease; stopping it here",
            local.run.run_id,
            write,
            local.epoch,
            "a later one" if current is None else current,
        )

    def _checkpointer(self, local: _Local) -> Callable[[RunCore, int], Awaitable[None]]:
        publisher = local.publisher

        async def checkpoint(run: RunCore, next_step: int) -> None:
            await publisher.flush()  # the snapshot's offset never runs ahead of the log
            if local.stop.is_set():
                raise FencedWriteError(f"durable run {run.run_id!r}: epoch {local.epoch} was fenced off")
            data = snapshot.capture(run, next_step=next_step)
            data["phase"] = "step"
            data["eventOffset"] = publisher.next_offset
            store = await self._open_store()
            try:
                await store.checkpoint_durable_run(
                    run.run_id,
                    owner=self.replica,
                    epoch=local.epoch,
                    snapshot=data,
                    lease_seconds=self.settings.lease_seconds,
                )
            except FencedWriteError as exc:
                self._fenced(local, "checkpoint", exc)
                raise
            except LeaseLostError:
                publisher.drop()  # the replica that has it now publishes; not even our error chunk
                raise

        return checkpoint

    async def _drive(self, local: _Local) -> RunResult | None:
        run, publisher = local.run, local.publisher
        keeper = asyncio.create_task(self._keep_lease(local))
        stopped = asyncio.create_task(local.stop.wait())
        try:
            work = asyncio.create_task(run.execute())
            done, _ = await asyncio.wait({work, keeper, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:  # the lease is lost: another replica has (or will have) the run
                publisher.drop()
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                return None
            result, failure = work.result()
            if local.stop.is_set() or isinstance(failure, LeaseLostError):
                publisher.drop()
                return None  # a write found the run another replica's
            if publisher.dropped and publisher.failure is None:
                return None  # a checkpoint found the lease gone: the run is another replica's
            await publisher.close()
            if local.stop.is_set():
                return None  # the log refused a chunk for the epoch
            status, error = _STATUS[result.status], str(failure or "")
            if publisher.failure is not None:
                log.error("durable run %s: the event log refused a chunk: %s", run.run_id, publisher.failure)
                status, error = FAILED, f"the event log refused a chunk: {_shown(publisher.failure)}"
            store = await self._open_store()
            # The record first: a reader that sees the log end finds the run's final status.
            try:
                await store.finish_durable_run(
                    run.run_id, owner=self.replica, epoch=local.epoch, status=status, error=error
                )
            except FencedWriteError as exc:
                self._fenced(local, "finish", exc)
                return None
            try:
                await self.events.finish(
                    run.run_id, self.settings.event_log.retention_seconds, epoch=local.epoch
                )
            except EventLogFencedError as exc:
                self._fenced(local, "event", exc)
                return None
            self._tell_ended(local.agent_id, result)
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
            stopped.cancel()

    def _tell_ended(self, agent_id: str, result: RunResult) -> None:
        """Tell `ended` of a run's end; a listener's fault is logged and the others still told."""
        for listener in self.ended:
            try:
                listener(agent_id, result)
            except Exception:
                log.warning("run %s: a listener of its end failed", result.run_id, exc_info=True)

    async def _keep_lease(self, local: _Local) -> None:
        """Renew the lease until the run ends; return (the run must stop) when it is lost, or when
        renewals failed so long that it would expire before the next try."""
        run = local.run
        lease = self.settings.lease_seconds
        held_until = time.monotonic() + lease
        while True:
            slept = time.monotonic()
            await asyncio.sleep(lease / 3)
            now = time.monotonic()
            if now >= held_until - lease / 6:  # paused (SIGSTOP, a starved loop) past a safe renewal
                log.warning(
                    "run %s: cannot renew its lease in time: this replica was paused or starved for "
                    "%.1f s and its lease (epoch %d) has run out or is about to; stopping here",
                    run.run_id,
                    now - slept,
                    local.epoch,
                )
                return
            try:
                # A store that is down makes a renewal wait out the store's own timeout (its pool's,
                # 5 s by default), which may be longer than the lease: give up in time to stop here
                # before the lease expires.
                async with asyncio.timeout(max(0.0, held_until - lease / 6 - time.monotonic())):
                    store = await self._open_store()
                    cancel = await store.renew_durable_lease(
                        run.run_id, owner=self.replica, epoch=local.epoch, lease_seconds=lease
                    )
            except FencedWriteError as exc:
                self._fenced(local, "renewal", exc)
                return
            except LeaseLostError:
                log.warning("run %s: its lease was taken over; stopping here", run.run_id)
                return
            except (MemoryStoreError, TimeoutError) as exc:
                self.metrics.lease_renewals_failed.inc()
                if time.monotonic() + lease / 3 >= held_until - lease / 6:
                    log.warning(
                        "run %s: cannot renew its lease (%s); stopping before it expires",
                        run.run_id,
                        str(exc) or "no answer in time",
                    )
                    return
                continue
            held_until = time.monotonic() + lease
            if cancel and run.options.abort_signal is not None:
                run.options.abort_signal.set()


_STATUS = {
    "success": DONE,
    "tripwire": DONE,
    "failed": FAILED,
    "aborted": CANCELLED,
    "suspended": SUSPENDED,
}
"""A run's status as its durable record keeps it."""


def _shown(exc: BaseException) -> str:
    """What a durable run's record keeps of why it failed: `GET /api/runs` shows it to clients, so
    never where the store or the event log is (the log line has the whole error)."""
    if isinstance(exc, MemoryStoreError):
        return client_message(exc)
    if isinstance(exc, EventLogError):
        return (
            "the event log is unavailable"
            if isinstance(exc, EventLogUnavailableError)
            else "the event log failed"
        )
    return str(exc)
