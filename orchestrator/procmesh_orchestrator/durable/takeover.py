"""Taking over durable runs whose lease expired: claimed only for the agents this replica has,
their log fenced before the claim commits, and left (counted, never failed) to another replica
when this one cannot resume them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.durable.events import EventLog
from procmesh_orchestrator.durable.publisher import without_start
from procmesh_orchestrator.errors import EventLogError, FencedWriteError, MemoryStoreError, SuspendError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.run import AgentSpec, CallOptions, snapshot
from procmesh_orchestrator.run.base import ChunkSink
from procmesh_orchestrator.run.loop import Run
from procmesh_orchestrator.store import FAILED, DurableRun, MemoryStore

if TYPE_CHECKING:
    from procmesh_orchestrator.durable.config import DurableConfig

log = logging.getLogger("procmesh_orchestrator.durable")

_KEEP_LEFT = 1024
"""Run ids remembered as left to other replicas (each counted once)."""
_LEFT_LOG_EVERY = 60.0
"""Seconds between two log lines about runs left to other replicas."""
_LEFT_PAGE = 100
"""Runs left to other replicas read at once (`TakeOver._note_unclaimable`)."""
_LEFT_PAGES = 10
"""Pages of them one look reads at most: beyond, the next look goes on."""
_OTHER_VERSIONS_AFTER = 3
"""Claim intervals a run started under another config version of its agent waits (past its
lease) for a replica of its own version, before this one takes it over."""


class CannotResume(Exception):
    """This replica lacks what the run needs (its agent): another replica may resume it."""


class TakeOver:
    """`DurableRuns`' take-over of other replicas' runs (what it needs of `DurableRuns` is
    declared here)."""

    _open_store: Callable[[], Awaitable[MemoryStore]]
    events: EventLog
    agents: Mapping[str, AgentSpec]
    versions: dict[str, str]
    metrics: OrchestratorMetrics
    settings: DurableConfig
    replica: str
    local: dict[str, Any]
    _left: OrderedDict[str, str]
    _left_logged: float
    _left_after: str | None
    """The last run of the last page of runs left to other replicas read (None: from the oldest)."""

    def _launch(
        self, agent_id: str, run_id: str, offset: int, epoch: int, build: Callable[[ChunkSink], Run]
    ) -> Any:
        raise NotImplementedError

    async def _claim_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.claim_interval_seconds)
            room = self.settings.max_runs - len(self.local)
            if room <= 0:
                continue
            try:
                store = await self._open_store()
                claimed = await store.claim_expired_durable_runs(
                    owner=self.replica,
                    lease_seconds=self.settings.lease_seconds,
                    limit=room,
                    agents=list(self.agents),
                    exclude=[run_id for run_id, why in self._left.items() if why == "resume"],
                    # a run of another config version waits a few looks for a replica of its own
                    versions=sorted(set(self.versions.values())) if self.versions else None,
                    other_versions_after=_OTHER_VERSIONS_AFTER * self.settings.claim_interval_seconds,
                    before_commit=self._raise_fences,
                )
            except (MemoryStoreError, EventLogError) as exc:
                log.warning("cannot look for durable runs to take over: %s", exc)
                continue
            except Exception:  # a bug: logged, and the loop goes on (it must never die silently)
                log.exception("looking for durable runs to take over failed")
                continue
            for record in claimed:
                await self._try_take_over(store, record)
            try:
                await self._note_unclaimable(store)
            except MemoryStoreError as exc:
                log.warning("cannot look for durable runs left to other replicas: %s", exc)
            except Exception:
                log.exception("looking for durable runs left to other replicas failed")

    async def _raise_fences(self, claimed: list[DurableRun]) -> None:
        """Raise the event log's fence of each claimed run to its new epoch, before the claim
        commits: from then on its former holder's chunks are refused."""
        for record in claimed:
            await self.events.fence(record.run_id, record.epoch)

    async def _note_unclaimable(self, store: MemoryStore) -> None:
        """Count (once per run) and log (at most once a minute, with their true number) the expired
        runs of agents this replica has not: they are left for a replica that has them, never
        failed here. A look reads up to `_LEFT_PAGES` pages of them, from where the last one
        stopped (a keyset cursor), and starts over from the oldest once it read the last page."""
        agents = list(self.agents)
        new: list[DurableRun] = []
        for _ in range(_LEFT_PAGES):
            page = await store.unclaimable_durable_runs(
                agents=agents, limit=_LEFT_PAGE, after=self._left_after
            )
            new += [r for r in page if r.run_id not in self._left]
            self._left_after = page[-1].run_id if len(page) == _LEFT_PAGE else None
            if self._left_after is None:
                break
        for record in new:
            self._leave(record.run_id, "agent")
        now = time.monotonic()
        if new and now - self._left_logged >= _LEFT_LOG_EVERY:
            self._left_logged = now
            total = await store.count_unclaimable_durable_runs(agents=agents)
            names = sorted({r.agent_id for r in new})
            log.warning(
                "%d expired durable run(s) of agent(s) this replica's config lacks (%s%s) are left for "
                "a replica that has them",
                total,
                ", ".join(repr(a) for a in names[:10]),
                ", ..." if len(names) > 10 else "",
            )

    def _leave(self, run_id: str, why: str) -> None:
        self._left[run_id] = why
        self.metrics.runs_left.labels(why).inc()
        while len(self._left) > _KEEP_LEFT:
            self._left.popitem(last=False)

    async def _try_take_over(self, store: MemoryStore, record: DurableRun) -> None:
        try:
            self._take_over(record)
        except (SuspendError, CannotResume) as exc:  # what this replica lacks: another may have it
            log.warning("run %s could not be resumed here (%s); left for another replica", record.run_id, exc)
            await self._write_back(
                record,
                "release",
                store.release_durable_run(record.run_id, owner=self.replica, epoch=record.epoch),
            )
            # noted once given back (this claim loop awaits us, so nothing claims it in between):
            # whoever reads the count then finds the run released
            self._leave(record.run_id, "resume")
        except Exception:  # a run nobody can run (a bad snapshot)
            log.exception("run %s could not be taken over", record.run_id)
            finish = store.finish_durable_run(
                record.run_id,
                owner=self.replica,
                epoch=record.epoch,
                status=FAILED,
                error="could not be resumed",
            )
            await self._write_back(record, "finish", finish)

    async def _write_back(self, record: DurableRun, write: str, done: Awaitable[Any]) -> None:
        """A claimed run given back or failed without being run: a write refused for its epoch
        (another replica claimed it since) is counted in ``procmesh_durable_fenced_writes_total``;
        one the store could not take is logged (the claim's lease then expires instead)."""
        try:
            await done
        except FencedWriteError:
            self.metrics.fenced_writes.labels(write).inc()
            log.info(
                "run %s: its %s under epoch %d was refused: another replica has it",
                record.run_id,
                write,
                record.epoch,
            )
        except MemoryStoreError as exc:
            log.warning("run %s: its %s failed (%s); its lease expires instead", record.run_id, write, exc)

    def _take_over(self, record: DurableRun) -> None:
        spec = self.agents.get(record.agent_id)
        if spec is None:
            raise CannotResume(f"this replica has no agent {record.agent_id!r}")
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
                sink = without_start(sink)  # the log's offset 0 is the run's start already
                return Run.resume(spec, data, None, options, sink=sink, metrics=self.metrics)

            offset = int(data["eventOffset"])
        mine = self.versions.get(record.agent_id, "")
        if record.config_version and mine and record.config_version != mine:
            self.metrics.takeovers_other_config.inc()
            log.info(
                "run %s was started under config version %s of agent %r; this replica has %s",
                run_id,
                record.config_version,
                record.agent_id,
                mine,
            )
        self._launch(record.agent_id, run_id, offset, record.epoch, build)
        self.metrics.runs_taken_over.inc()
        log.info(
            "run %s taken over (attempt %d, epoch %d) at step %s",
            run_id,
            record.attempts,
            record.epoch,
            data.get("nextStep", 0),
        )
