"""Durable runs over both APIs: starting one, reattaching to its event log, runs as a resource.

A durable run is not tied to the request that started it: its chunks go to the event log with
offsets (`DurableRuns.attach` reads them on any replica), so a client that disconnects does not
abort it and can come back (``observe``, ``Last-Event-ID``). Only a cancel (`cancel`) stops it.
Every route acts within the caller's resource as the memory API does: a key bound to a resource
sees that resource's runs only, and another's is answered exactly like a run that does not exist;
an operator key (or any caller when no key is configured) sees every resource's.

This is the service's view of durable runs, kept in the API room because it speaks the service's
callers, errors and chunks, which `procmesh_orchestrator.durable` (the runs themselves) never sees.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.durable import DurableRuns
from procmesh_orchestrator.errors import (
    EventLogError,
    EventLogNotFoundError,
    EventLogUnavailableError,
    InvalidMemoryInputError,
    MemoryStoreError,
    StoreUnavailableError,
    SuspendError,
)
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import (
    BadRequestError,
    DurableRunGoneError,
    DurableUnavailableError,
    ServiceError,
)
from procmesh_orchestrator.service.api.calls import AgentCall
from procmesh_orchestrator.service.api.results import Chunk
from procmesh_orchestrator.store import (
    CANCELLED,
    DONE,
    DURABLE_STATUSES,
    FAILED,
    FINISHED,
    MAX_ID_CHARS,
    MAX_PAGE,
    RUNNING,
    SUSPENDED,
    DurableRun,
    MemoryStore,
)

if TYPE_CHECKING:
    from procmesh_orchestrator.app import App
    from procmesh_orchestrator.service.api.core import ServiceCore

log = logging.getLogger(__name__)

DEFAULT_RUNS_PER_PAGE = 20

RUN_STATUS = {
    DONE: "success",
    FAILED: "failed",
    CANCELLED: "aborted",
    SUSPENDED: "suspended",
    RUNNING: "running",
}
"""A durable record's status as a run's (`RunResult.status`): what a stream's last message says
when the result itself is not on this replica (``running``: the log ended before the record did)."""


def is_durable(service: ServiceCore, agent_id: str, call: AgentCall) -> bool:
    """Whether this call runs durably: the caller asked, or the agent is configured so."""
    agent = service.app.config.agents.get(agent_id)
    return call.durable or (agent is not None and agent.durable)


@contextlib.contextmanager
def durable_errors() -> Iterator[None]:
    """The store's and the event log's errors as the APIs answer them (the messages never name
    the store's path, host or port: the log line does)."""
    try:
        yield
    except (StoreUnavailableError, EventLogUnavailableError) as exc:
        log.warning("durable runs: %s", exc)
        what = "store" if isinstance(exc, MemoryStoreError) else "event log"
        raise DurableUnavailableError(f"the durable runs' {what} is unreachable; retry later") from None
    except InvalidMemoryInputError as exc:
        raise BadRequestError(str(exc).partition(": ")[2] or str(exc)) from None
    except SuspendError as exc:
        raise BadRequestError(str(exc)) from None
    except (MemoryStoreError, EventLogError) as exc:
        log.warning("durable runs: %s", exc)
        raise ServiceError("durable runs: internal error") from None


async def manager(app: App) -> DurableRuns:
    """The durable-run manager, started on first use (503 when its log or store is down)."""
    with durable_errors():
        return await app.durable_runs()


async def begin(service: ServiceCore, agent_id: str, call: AgentCall) -> tuple[DurableRuns, str]:
    """Start a durable run of the call; the manager running it and the run's id.

    The event log is pinged first: while it is down a run could not publish its first chunk, so
    the call is refused (503) rather than kept waiting.
    """
    durable = await manager(service.app)
    with durable_errors():
        await durable.events.ping()
        run_id = await durable.begin(agent_id, call.input, call.options)
    return durable, run_id


def check_run_id(value: Any, name: str = "runId") -> str:
    """A run id as the store takes it; a 400 naming `name` otherwise."""
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        raise BadRequestError(f"{name}: must be a printable id of 1 to {MAX_ID_CHARS} characters")
    return value


async def store_of(app: App) -> MemoryStore:
    """The store durable runs are kept in (opened on first use)."""
    with durable_errors():
        return await app.suspended_runs_store()


async def visible_run(service: ServiceCore, run_id: str, caller: Caller) -> DurableRun:
    """The durable run, when the caller may see it: a 404 for none and for another resource's."""
    run_id = check_run_id(run_id)
    store = await store_of(service.app)
    with durable_errors():
        record = await store.get_durable_run(run_id)
    if record is None or not caller.may_see(record.resource_id):
        raise DurableRunGoneError(f"no durable run {run_id[:64]!r}")
    return record


async def cancel(service: ServiceCore, record: DurableRun) -> tuple[bool, DurableRun]:
    """Ask the run to stop (the replica running it stops it at once, or at its next renewal):
    whether it was still going (running or suspended), and the run."""
    durable = await manager(service.app)
    with durable_errors():
        after = await durable.cancel(record.run_id)
    return after.status in (RUNNING, SUSPENDED), after


# -- reattaching ------------------------------------------------------------------------------


async def attach(durable: DurableRuns, record: DurableRun, offset: int) -> AsyncIterator[tuple[int, Chunk]]:
    """The run's events from `offset` on, checked to exist before any is sent (404 when the log's
    retention passed). A missing log is told apart from an empty one by reading its first event."""
    events = durable.attach(record.run_id, offset)
    with durable_errors():
        held = await durable.events.next_offset(record.run_id)
    if held > 0:
        return events
    if record.status in FINISHED:
        raise DurableRunGoneError(f"durable run {record.run_id[:64]!r}: its events are no longer kept")
    try:  # a run that has just begun (its first chunk is on its way), or a log that is gone
        with durable_errors():
            first = await anext(events)
    except StopAsyncIteration:
        return _empty()
    except EventLogNotFoundError:
        raise DurableRunGoneError(
            f"durable run {record.run_id[:64]!r}: its events are no longer kept"
        ) from None
    return _chain(first, events)


async def _empty() -> AsyncIterator[tuple[int, Chunk]]:
    return
    yield  # pragma: no cover  (an async generator that yields nothing)


async def _chain(
    first: tuple[int, Chunk], rest: AsyncIterator[tuple[int, Chunk]]
) -> AsyncIterator[tuple[int, Chunk]]:
    yield first
    async for item in rest:
        yield item


LOG_CUT = "the run's event log is unreachable: observe again from the last event id + 1"


@dataclass
class Ending:
    """How a durable run's stream ends: its status and the calls awaiting a decision."""

    status: str
    suspended: list[dict[str, Any]]


async def ending(service: ServiceCore, durable: DurableRuns, run_id: str, saw_tripwire: bool) -> Ending:
    """The status a stream's last message carries once the run's log ended: its result when this
    replica ran it, else its record's."""
    local = durable.local.get(run_id)
    if local is not None:
        with contextlib.suppress(Exception):
            done = await durable.result(run_id)
            if done is not None:
                return Ending(done.status, done.suspended)
    try:
        store = await store_of(service.app)
        with durable_errors():
            record = await store.get_durable_run(run_id)
    except ServiceError:
        record = None
    if record is None:
        return Ending("running", [])
    status = RUN_STATUS.get(record.status, record.status)
    if status == "success" and saw_tripwire:
        status = "tripwire"
    pending = (record.snapshot.get("pending") or {}).get("calls") or [] if record.status == SUSPENDED else []
    return Ending(status, list(pending))


# -- runs as a resource -----------------------------------------------------------------------


@dataclass
class RunQuery:
    """A validated listing of durable runs."""

    resource_id: str | None
    agent_id: str | None
    status: str | None
    page: int
    per_page: int


def run_query(
    *,
    resource_id: str | None,
    agent_id: str | None,
    status: str | None,
    page: int,
    per_page: int,
    caller: Caller,
) -> RunQuery:
    """Check a listing's filters; a tenant key lists its own resource (naming another: 404, as
    a resource without runs would be for an operator)."""
    if resource_id:
        check_run_id(resource_id, "resourceId")
    if agent_id:
        check_run_id(agent_id, "agentId")
    if status and status not in DURABLE_STATUSES:
        raise BadRequestError(f"status: must be one of {', '.join(DURABLE_STATUSES)}")
    if not 0 <= page <= 2**62 // MAX_PAGE:
        raise BadRequestError("page: must be an integer from 0")
    if not 1 <= per_page <= MAX_PAGE:
        raise BadRequestError(f"perPage: must be an integer from 1 to {MAX_PAGE}")
    if not caller.operator:
        if caller.resource is None or (resource_id and resource_id != caller.resource):
            raise DurableRunGoneError("no durable runs of that resource for this API key")
        resource_id = caller.resource
    return RunQuery(resource_id or None, agent_id or None, status or None, page, per_page)


async def list_runs(service: ServiceCore, query: RunQuery) -> tuple[list[DurableRun], int]:
    """One page of durable runs, newest first, and how many match."""
    store = await store_of(service.app)
    with durable_errors():
        return await store.list_durable_runs(
            resource_id=query.resource_id,
            agent_id=query.agent_id,
            status=query.status,
            page=query.page,
            per_page=query.per_page,
        )
