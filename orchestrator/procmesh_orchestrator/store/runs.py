"""Suspended and durable runs, their snapshots and leases: the store's second aggregate.

A run waiting for tool-call approvals is kept as a `SuspendedRun`, so that any replica sharing the
store can resume it; claiming one is atomic, so exactly one approval resumes it.

A durable run (`DurableRun`) is checkpointed at every step boundary and held by one replica through
a lease it renews; when the lease expires, another replica claims the run and continues from its
last snapshot. Lease times are the database's clock, never a replica's, so replicas whose clocks
disagree still agree on who holds what. Every claim raises the run's epoch (its fencing token: 1 at
creation); every write the run makes (checkpoint, renewal, finish, its memory save, its suspension,
its cost reservations) names the epoch it holds (`RunFence`) and is refused in the same transaction
when the run's epoch moved on (`FencedWriteError`), so a replica that lost its lease writes nothing,
however long it slept.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

SUSPENDED = "suspended"
RESUMING = "resuming"
RESUMED = "resumed"
"""A resumed run that ended: its snapshot is dropped, its id stays so a late decision is a conflict."""


@dataclass(frozen=True)
class SuspendedRun:
    """A run waiting for a decision on some of its tool calls, saved so any replica can resume it."""

    run_id: str
    agent_id: str
    thread_id: str
    """The run's memory thread, "" when it has none."""
    resource_id: str
    """The run's resource, "" when it has none."""
    tool_call_ids: tuple[str, ...]
    """The tool calls awaiting a decision (at least one)."""
    snapshot: dict[str, Any]
    """Whatever the run needs to resume, as JSON; opaque to the store (it can be megabytes)."""
    created_at: str = ""
    """ISO 8601, UTC, set by the store when the run is saved (saved again: the new time)."""
    status: str = SUSPENDED
    """`SUSPENDED`, or `RESUMING` once claimed by `RunStore.claim_suspended`."""


RUNNING = "running"
DONE = "done"
FAILED = "failed"
CANCELLED = "cancelled"
DURABLE_STATUSES = (RUNNING, DONE, FAILED, CANCELLED, SUSPENDED)
FINISHED = (DONE, FAILED, CANCELLED)
"""The statuses a durable run ends in: its snapshot is dropped, its row stays for listing."""


@dataclass(frozen=True)
class RunFence:
    """A durable run's claim on a write: the run, and the epoch (fencing token) its holder has. A
    write given one is made only if the run is still running at that epoch, checked in the same
    transaction (`FencedWriteError` otherwise, nothing written)."""

    run_id: str
    epoch: int


@dataclass(frozen=True)
class DurableRun:
    """A run checkpointed at every step boundary, held by one replica through a renewed lease."""

    run_id: str
    agent_id: str
    thread_id: str = ""
    """The run's memory thread, "" when it has none."""
    resource_id: str = ""
    """The run's resource, "" when it has none."""
    status: str = RUNNING
    """`RUNNING`, then one of `DONE`, `FAILED`, `CANCELLED` or `SUSPENDED`."""
    snapshot: dict[str, Any] = field(default_factory=dict)
    """The last checkpoint, as JSON; opaque to the store (it can be megabytes). Listings leave it
    empty, and so does a finished run (`DONE`, `FAILED`, `CANCELLED`)."""
    owner: str = ""
    """The replica holding the lease ("" when none: the run ended, or a replica that could not resume
    it gave it back for another to claim)."""
    lease_expires_at: str = ""
    """ISO 8601, UTC, the database's clock ("" when nobody holds the run)."""
    cancel_requested: bool = False
    attempts: int = 1
    """1 + how many times the run was claimed after its lease expired."""
    epoch: int = 1
    """The fencing token: 1 at creation, one more at every claim. A write under an older epoch is
    refused (`RunFence`)."""
    config_version: str = ""
    """The fingerprint of the agent's configuration on the replica that created the run ("" when
    it gave none): a replica taking the run over with another one says so."""
    error: str = ""
    """Why the run failed ("" otherwise)."""
    created_at: str = ""
    """ISO 8601, UTC, set by the store."""
    updated_at: str = ""
    """ISO 8601, UTC: the last checkpoint, claim or finish."""


class RunStore(Protocol):
    """Suspended and durable runs. Every write is one transaction."""

    async def save_suspended(self, run: SuspendedRun, *, fence: RunFence | None = None) -> None:
        """Save a suspended run in one transaction, replacing one of the same `run_id` (whatever
        its status: a resumed run that suspends anew is saved again). Its status is `SUSPENDED`.
        With a `fence`, only while the durable run holds that epoch (`FencedWriteError`)."""

    async def claim_suspended(
        self, run_id: str, tool_call_id: str | None, *, resource_id: str | None = None
    ) -> SuspendedRun:
        """Take the run to resume it: atomically check that it exists, awaits `tool_call_id` (None:
        awaits exactly one call, that one; several are `InvalidMemoryInputError`) and is
        `SUSPENDED`, mark it `RESUMING` and return it. Of concurrent claims (in any process) exactly
        one wins. `SuspendedRunNotFoundError` when there is no such run or it awaits no such call;
        `ResumeConflictError` when it is already claimed. With `resource_id`, a run of another
        resource is not found, whatever its state, in the same words as a missing one."""

    async def suspended_run_exists(self, run_id: str) -> bool:
        """Whether a run of this id was saved as suspended (awaiting, resuming or resumed): a new
        run must not take its id (its suspension would replace the other's)."""

    async def release_suspended(self, run_id: str) -> None:
        """Give a claimed run back (`SUSPENDED` again): its resume failed before changing anything.
        No error when the run is not claimed or does not exist."""

    async def finish_suspended(self, run_id: str) -> None:
        """The resumed run ended: its snapshot goes, its id stays as `RESUMED`, so a late second
        decision is a `ResumeConflictError` and the run is no longer listed."""

    async def delete_suspended(self, run_id: str) -> None:
        """Forget the run entirely (no error when it does not exist)."""

    async def list_suspended(
        self,
        agent_id: str,
        *,
        thread_id: str | None = None,
        resource_id: str | None = None,
        from_date: str | None = None,
        to_date: str | None = None,
        page: int = 0,
        per_page: int = 20,
    ) -> tuple[list[SuspendedRun], int]:
        """The agent's suspended and resuming runs, newest first, one page of them, and how many
        match in all. A given `thread_id` or `resource_id` must match ("" selects runs without
        one); `from_date` and `to_date` (ISO 8601, UTC when no offset is given) bound `created_at`
        as the store reports it, both inclusive."""

    async def create_durable_run(self, run: DurableRun, *, owner: str, lease_seconds: float) -> DurableRun:
        """Insert the run (its ids and snapshot; the store sets the rest) as `RUNNING`, held by
        `owner` for `lease_seconds`, and return it as stored. `DurableRunExistsError` when a run of
        its id exists (whatever its status)."""

    async def checkpoint_durable_run(
        self, run_id: str, *, owner: str, epoch: int, snapshot: dict[str, Any], lease_seconds: float
    ) -> None:
        """Replace the snapshot and renew the lease, in one statement, if `owner` still holds the
        running run at `epoch`: an expired lease nobody claimed yet is still held.
        `FencedWriteError` when another replica claimed it since (the epoch moved on),
        `LeaseLostError` when it is no longer running (nothing is written);
        `DurableRunNotFoundError` when there is no such run."""

    async def renew_durable_lease(self, run_id: str, *, owner: str, epoch: int, lease_seconds: float) -> bool:
        """Renew the lease on the same condition as a checkpoint; return whether a cancel was
        requested (the runner polls for it with its renewals). Errors as for a checkpoint."""

    async def claim_expired_durable_runs(
        self,
        *,
        owner: str,
        lease_seconds: float,
        limit: int,
        agents: Collection[str] | None = None,
        exclude: Collection[str] = (),
        versions: Collection[str] | None = None,
        other_versions_after: float = 0.0,
        before_commit: Callable[[list[DurableRun]], Awaitable[None]] | None = None,
    ) -> list[DurableRun]:
        """Take up to `limit` running runs whose lease expired, oldest lease first: each becomes
        `owner`'s for `lease_seconds`, its attempts and its epoch one more; return them with their
        snapshots. Of replicas claiming at the same time, each run goes to exactly one.

        `agents`: only runs of these agents are taken (in the claim's own statement; None: any), so
        a replica never takes a run it has no agent for; `exclude`: run ids not to take (runs this
        replica found it cannot resume); `versions`: this replica's config versions of its agents,
        whose runs it takes at once, while a run started under another version (not "") is taken
        only once its lease expired `other_versions_after` seconds ago, so that during a rolling
        deploy a replica of the run's own version gets it first. `before_commit` is awaited with the
        claimed runs before the claim commits (their rows locked): the event log's fence is raised
        there, so no writer of the old epoch is heard from once the claim is visible; if it
        raises, nothing is claimed."""

    async def unclaimable_durable_runs(
        self, *, agents: Collection[str], limit: int, after: str | None = None
    ) -> list[DurableRun]:
        """Up to `limit` running runs whose lease expired and whose agent is none of `agents`, oldest
        first (by creation), without snapshots: what a replica with these agents leaves to others.
        `after`: the last run of the page before (a keyset page; none once that run is gone)."""

    async def count_unclaimable_durable_runs(self, *, agents: Collection[str]) -> int:
        """How many runs `unclaimable_durable_runs` lists, all its pages together."""

    async def release_durable_run(self, run_id: str, *, owner: str, epoch: int) -> None:
        """Give a claimed run up at once, still running, for another replica to claim (this one
        cannot resume it). Errors as for a checkpoint."""

    async def finish_durable_run(
        self, run_id: str, *, owner: str, epoch: int, status: str, error: str = ""
    ) -> None:
        """End the run as `status` (`DONE`, `FAILED`, `CANCELLED` or `SUSPENDED`) and release its
        lease. A finished run's snapshot is dropped (its row stays for listing); a suspended one
        keeps it. `error` is cut to 16,384 characters. Errors as for a checkpoint."""

    async def request_durable_cancel(self, run_id: str) -> DurableRun:
        """Ask the run to stop: sets ``cancel_requested`` if it is running or suspended (a run
        that ended stays as it ended). Returns the run without its snapshot.
        `DurableRunNotFoundError` when there is no such run."""

    async def get_durable_run(self, run_id: str) -> DurableRun | None:
        """The run with its snapshot, or None."""

    async def list_durable_runs(
        self,
        *,
        resource_id: str | None = None,
        agent_id: str | None = None,
        status: str | None = None,
        page: int = 0,
        per_page: int = 20,
    ) -> tuple[list[DurableRun], int]:
        """Runs newest first, one page of them WITHOUT snapshots (listing stays cheap), and how
        many match in all. A given `resource_id` ("" selects runs without one), `agent_id` or
        `status` must match."""
