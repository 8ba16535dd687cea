"""Durable runs in both stores: the same SQL given the backend's clock, and the fence every write of
a durable run passes.

A run's row holds its epoch (its fencing token): 1 at creation, one more at every claim. Every
write of the run names the epoch its writer holds; the run's own writes (checkpoint, renewal,
finish) carry it in their UPDATE's WHERE, and the writes it makes elsewhere (its memory save, its
suspension, its cost reservations) first read the run's row locked (``FOR UPDATE``; SQLite's
BEGIN IMMEDIATE holds the file's write lock) in their own transaction (`hold_fence`). A claim
raises the epoch under the same lock, so a writer whose epoch moved on is refused
(`FencedWriteError`) and writes nothing, however long it slept.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace
from typing import Any

from procmesh_orchestrator.errors import (
    DurableRunExistsError,
    DurableRunNotFoundError,
    FencedWriteError,
    InvalidMemoryInputError,
    LeaseLostError,
    MemoryStoreError,
)
from procmesh_orchestrator.store._checks import (
    MAX_PAGE,
    check_count,
    check_id,
    check_optional_id,
    decode,
    encode_snapshot,
    label,
    run_owners,
)
from procmesh_orchestrator.store._sql import Query, StoreHooks, page_of, page_sql
from procmesh_orchestrator.store.runs import (
    CANCELLED,
    DONE,
    DURABLE_STATUSES,
    FAILED,
    FINISHED,
    RUNNING,
    SUSPENDED,
    DurableRun,
    RunFence,
)

DURABLE_COLUMNS = (
    "run_id, agent_id, thread_id, resource_id, status, snapshot, owner, lease_expires_at, "
    "cancel_requested, attempts, error, created_at, updated_at, epoch, config_version"
)
LISTED_COLUMNS = DURABLE_COLUMNS.replace("snapshot", "'{}' AS snapshot")
"""The columns without the snapshot: what listings (and writes that already know it) return."""
MAX_LEASE_SECONDS = 7 * 24 * 3600
MAX_CLAIM = 1000
"""Most runs one claim takes."""
MAX_CLAIM_NAMES = 10_000
"""Most agents (or excluded runs) a claim may name."""
MAX_ERROR_CHARS = 16_384
"""A failed run's error is cut to this many characters."""
MAX_EPOCH = 2**62
ENDINGS = (DONE, FAILED, CANCELLED, SUSPENDED)
"""The statuses `finish_durable_run` accepts."""


def check_lease(store: str, value: object) -> float:
    """A lease duration in seconds: a finite number above 0 and at most `MAX_LEASE_SECONDS`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_LEASE_SECONDS
    ):
        raise InvalidMemoryInputError(
            f"memory store {store}: lease_seconds must be a number above 0 and at most "
            f"{MAX_LEASE_SECONDS}, got {label(value)}"
        )
    return float(value)


def check_epoch(store: str, value: object) -> int:
    """An epoch (fencing token): an integer from 1."""
    return check_count(store, "epoch", value, low=1, high=MAX_EPOCH)


def check_fence(store: str, fence: object) -> RunFence:
    """A `RunFence` with a usable run id and epoch."""
    if not isinstance(fence, RunFence):
        raise InvalidMemoryInputError(
            f"memory store {store}: a fence is a RunFence, not {type(fence).__name__}"
        )
    return RunFence(check_id(store, "run", fence.run_id), check_epoch(store, fence.epoch))


def check_status(store: str, value: object, allowed: tuple[str, ...]) -> str:
    """A durable run status among `allowed`."""
    if not isinstance(value, str) or value not in allowed:
        raise InvalidMemoryInputError(
            f"memory store {store}: a durable run status is one of {', '.join(allowed)}, got {label(value)}"
        )
    return value


def clean_error(store: str, value: object) -> str:
    """A run's error as text both databases store: cut short, NUL and lone surrogates replaced."""
    if not isinstance(value, str):
        raise InvalidMemoryInputError(
            f"memory store {store}: a durable run's error must be a string, not {type(value).__name__}"
        )
    text = value[:MAX_ERROR_CHARS].replace("\x00", "\ufffd")
    return text.encode("utf-8", "replace").decode("utf-8")


def encode_durable(store: str, run: object, max_bytes: int) -> tuple[str, ...]:
    """A run to create as ``(run_id, agent_id, thread_id, resource_id, snapshot, config_version)``
    (the snapshot as JSON text), every field checked before anything is written."""
    if not isinstance(run, DurableRun):
        raise InvalidMemoryInputError(
            f"memory store {store}: a durable run is a DurableRun, not {type(run).__name__}"
        )
    run_id = check_id(store, "run", run.run_id)
    where = f"durable run {label(run_id)}"
    owners = run_owners(store, where, run)
    version = check_optional_id(store, f"{where}: config version", run.config_version)
    return run_id, *owners, encode_snapshot(store, where, run.snapshot, max_bytes), version


def durable_run(row: Any, when: Callable[[Any], str]) -> DurableRun:
    """A stored row (`DURABLE_COLUMNS`) as a run; `when` renders the backend's times as ISO 8601."""
    (run_id, agent_id, thread_id, resource_id, status, snapshot, owner, lease, cancel) = row[:9]
    attempts, error, created_at, updated_at, epoch, version = row[9:]
    return DurableRun(
        run_id=run_id,
        agent_id=agent_id,
        thread_id=thread_id,
        resource_id=resource_id,
        status=status,
        snapshot=decode(snapshot),
        owner=owner,
        lease_expires_at="" if lease is None else when(lease),
        cancel_requested=bool(cancel),
        attempts=int(attempts),
        error=error,
        created_at=when(created_at),
        updated_at=when(updated_at),
        epoch=int(epoch),
        config_version=version,
    )


def fenced(store: str, run_id: str, epoch: int, current: int, doing: str) -> FencedWriteError:
    """The refusal of a write under `epoch` to a run now at `current`."""
    return FencedWriteError(
        f"memory store {store}: durable run {label(run_id)}: {doing} under epoch {epoch} refused: the "
        f"run is at epoch {current} (another replica claimed it)",
        epoch,
        current,
    )


def lease_lost(store: str, run_id: str, owner: str, epoch: int, found: list[Any]) -> MemoryStoreError:
    """Why a write of `owner` under `epoch` to a run it should hold matched no row; `found` is the
    run's ``(status, owner, epoch)`` as read in the same transaction."""
    where = f"memory store {store}: durable run {label(run_id)}"
    if not found:
        return DurableRunNotFoundError(f"memory store {store}: no durable run {label(run_id)}")
    status, _, current = found[0]
    if int(current) != epoch:
        return fenced(store, run_id, epoch, int(current), "a write")
    if status != RUNNING:
        return LeaseLostError(f"{where} is {status}, no longer running")
    return LeaseLostError(f"{where} is held by another owner than {label(owner)}: its lease was claimed")


async def hold_fence(store: str, query: Query, fence: RunFence, p: str, lock: str, doing: str) -> list[str]:
    """Check, first in a write's transaction, that the fence's run is running at its epoch, and
    lock the run's row until the write commits (`lock`: `` FOR UPDATE``, or "" where the
    transaction holds the database's write lock): a claim cannot come between. The ids of the
    messages the run's turn saved so far; `FencedWriteError` (the caller writes nothing) when the
    epoch moved on, `LeaseLostError` when the run is no longer running."""
    rows = await query(
        f"SELECT epoch, status, saved_turn FROM durable_runs WHERE run_id = {p}{lock}", (fence.run_id,)
    )
    if not rows:
        raise DurableRunNotFoundError(f"memory store {store}: no durable run {label(fence.run_id)}")
    epoch, status, saved = rows[0]
    if int(epoch) != fence.epoch:
        raise fenced(store, fence.run_id, fence.epoch, int(epoch), doing)
    if status != RUNNING:
        raise LeaseLostError(
            f"memory store {store}: durable run {label(fence.run_id)} is {status}, no longer running: "
            f"{doing} refused"
        )
    return [str(i) for i in decode(saved)]


async def hold_turn(
    store: str, query: Query, fence: RunFence, p: str, lock: str, key: tuple[str, str], ids: list[str]
) -> None:
    """A fenced memory save's part in its transaction, before the turn's messages are written:
    the fence (`hold_fence`), then the run's turn made idempotent by the run's id. The messages an
    earlier save of this run put in the thread and this one does not repeat are deleted (a
    take-over that ran the last step again gave its messages new ids), and the run's row records
    this save's ids. `key` is the thread's ``(resource_id, thread_id)``."""
    earlier = await hold_fence(store, query, fence, p, lock, f"saving a turn to thread {label(key[1])}")
    stale = [message_id for message_id in earlier if message_id not in set(ids)]
    if stale:
        await query(
            f"DELETE FROM messages WHERE resource_id = {p} AND thread_id = {p} "
            f"AND id IN ({', '.join([p] * len(stale))})",
            (*key, *stale),
        )
    await query(
        f"UPDATE durable_runs SET saved_turn = {p} WHERE run_id = {p}",
        (encode_ids(ids), fence.run_id),
    )


def encode_ids(ids: list[str]) -> str:
    """Message ids as the run's row keeps them (a JSON list)."""
    return json.dumps(ids, ensure_ascii=True, separators=(",", ":"))


class DurableRunMethods(StoreHooks):
    """The durable-run methods, the same SQL on both backends given the backend's clock (`_now`,
    `_lease`, `_ago`) and how a claim passes rows another one holds (`_skip_locked`)."""

    async def create_durable_run(self, run: DurableRun, *, owner: str, lease_seconds: float) -> DurableRun:
        """Insert the run as `RUNNING` at epoch 1, held by `owner`; an existing id is
        `DurableRunExistsError`."""
        row = encode_durable(self.name, run, self._max_snapshot_bytes)
        lease = self._lease_arg(check_lease(self.name, lease_seconds))
        owner = check_id(self.name, "owner", owner)
        p, now = self.placeholder, self._now
        sql = (
            "INSERT INTO durable_runs (run_id, agent_id, thread_id, resource_id, snapshot, "
            f"config_version, owner, lease_expires_at, created_at, updated_at) VALUES ({p}, {p}, {p}, "
            f"{p}, {p}, {p}, {p}, {self._lease}, {now}, {now}) ON CONFLICT (run_id) DO NOTHING "
            f"RETURNING {LISTED_COLUMNS}"
        )
        rows = await self._transact(
            lambda query: query(sql, (*row, owner, lease)), f"creating durable run {row[0]!r}"
        )
        if not rows:
            raise DurableRunExistsError(
                f"memory store {self.name}: a durable run {label(row[0])} exists already"
            )
        return replace(durable_run(rows[0], self._moment), snapshot=run.snapshot)

    async def checkpoint_durable_run(
        self, run_id: str, *, owner: str, epoch: int, snapshot: dict[str, Any], lease_seconds: float
    ) -> None:
        """Replace the snapshot and renew the lease if `owner` holds the running run at `epoch`."""
        run_id = check_id(self.name, "run", run_id)
        where = f"durable run {label(run_id)}"
        body = encode_snapshot(self.name, where, snapshot, self._max_snapshot_bytes)
        lease = self._lease_arg(check_lease(self.name, lease_seconds))
        p = self.placeholder
        changes = f"snapshot = {p}, lease_expires_at = {self._lease}, updated_at = {self._now}"
        await self._while_held(run_id, owner, epoch, changes, (body, lease), "checkpointing")

    async def renew_durable_lease(self, run_id: str, *, owner: str, epoch: int, lease_seconds: float) -> bool:
        """Renew the lease if `owner` holds the running run at `epoch`; whether a cancel was
        requested."""
        run_id = check_id(self.name, "run", run_id)
        lease = self._lease_arg(check_lease(self.name, lease_seconds))
        changes = f"lease_expires_at = {self._lease}"
        rows = await self._while_held(run_id, owner, epoch, changes, (lease,), "renewing the lease of")
        return bool(rows[0][0])

    async def finish_durable_run(
        self, run_id: str, *, owner: str, epoch: int, status: str, error: str = ""
    ) -> None:
        """End the run (releasing its lease); a finished one's snapshot goes, a suspended one's stays."""
        run_id = check_id(self.name, "run", run_id)
        status = check_status(self.name, status, ENDINGS)
        p = self.placeholder
        changes = (
            f"status = {p}, error = {p}, owner = '', lease_expires_at = NULL, updated_at = {self._now}"
            + (", snapshot = '{}'" if status in FINISHED else "")
        )
        error = clean_error(self.name, error)
        await self._while_held(run_id, owner, epoch, changes, (status, error), "finishing")

    async def _while_held(
        self, run_id: str, owner: object, epoch: object, changes: str, args: tuple[Any, ...], doing: str
    ) -> list[Any]:
        """Apply `changes` in one UPDATE if `owner` holds the running run at `epoch` (its row's
        owner and epoch are the truth, even past the lease's end); the rows it returns
        (``cancel_requested``)."""
        owner = check_id(self.name, "owner", owner)
        epoch = check_epoch(self.name, epoch)
        p = self.placeholder
        sql = (
            f"UPDATE durable_runs SET {changes} WHERE run_id = {p} AND owner = {p} AND epoch = {p} "
            f"AND status = '{RUNNING}' RETURNING cancel_requested"
        )

        async def write(query: Query) -> list[Any]:
            rows = await query(sql, (*args, run_id, owner, epoch))
            if not rows:
                found = await query(
                    f"SELECT status, owner, epoch FROM durable_runs WHERE run_id = {p}", (run_id,)
                )
                raise lease_lost(self.name, run_id, owner, epoch, found)
            return rows

        return await self._transact(write, f"{doing} durable run {run_id!r}")

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
        """Take up to `limit` running runs whose lease expired, oldest lease first, for `owner`
        (only runs of `agents`, when given, and none of the run ids in `exclude`; with `versions`,
        a run started under another config version only once its lease expired
        `other_versions_after` seconds ago), each at its next epoch."""
        owner = check_id(self.name, "owner", owner)
        lease = self._lease_arg(check_lease(self.name, lease_seconds))
        limit = check_count(self.name, "limit", limit, low=1, high=MAX_CLAIM)
        names = None if agents is None else self._names("agent", agents)
        if names == []:
            return []
        skipped = self._names("run", exclude)
        mine = [] if versions is None else self._names("config version", versions)
        p, now = self.placeholder, self._now
        only, args = "", [*(names or ()), *skipped]
        if names is not None:
            only += f" AND agent_id IN ({', '.join([p] * len(names))})"
        if skipped:
            only += f" AND run_id NOT IN ({', '.join([p] * len(skipped))})"
        if versions is not None:
            grace = 0.0 if other_versions_after == 0 else check_lease(self.name, other_versions_after)
            same = f" OR config_version IN ({', '.join([p] * len(mine))})" if mine else ""
            only += f" AND (config_version = ''{same} OR lease_expires_at < {self._ago})"
            args += [*mine, self._ago_arg(grace)]
        expired = (
            f"SELECT run_id FROM durable_runs WHERE status = '{RUNNING}' AND lease_expires_at < {now}"
            f"{only} ORDER BY lease_expires_at, run_id LIMIT {p}{self._skip_locked}"
        )

        async def claim(query: Query) -> list[DurableRun]:
            run_ids = [row[0] for row in await query(expired, (*args, limit))]
            if not run_ids:
                return []
            sql = (
                f"UPDATE durable_runs SET owner = {p}, lease_expires_at = {self._lease}, "
                f"attempts = attempts + 1, epoch = epoch + 1, updated_at = {now} "
                f"WHERE run_id IN ({', '.join([p] * len(run_ids))}) RETURNING {DURABLE_COLUMNS}"
            )
            order = {run_id: n for n, run_id in enumerate(run_ids)}
            rows = sorted(await query(sql, (owner, lease, *run_ids)), key=lambda row: order[row[0]])
            runs = [durable_run(row, self._moment) for row in rows]
            if before_commit is not None and runs:
                await before_commit(runs)  # raises: the transaction rolls back, nothing is claimed
            return runs

        return await self._transact(claim, f"claiming expired durable runs for {owner!r}")

    def _names(self, kind: str, ids: Collection[str]) -> list[str]:
        """Ids a claim filters on, checked, each once, at most `MAX_CLAIM_NAMES` of them."""
        if isinstance(ids, str):
            raise InvalidMemoryInputError(
                f"memory store {self.name}: {kind} ids are a collection, not a string"
            )
        names = sorted({check_id(self.name, kind, value) for value in ids})
        if len(names) > MAX_CLAIM_NAMES:
            raise InvalidMemoryInputError(
                f"memory store {self.name}: a claim names at most {MAX_CLAIM_NAMES} {kind} ids, "
                f"not {len(names)}"
            )
        return names

    async def unclaimable_durable_runs(
        self, *, agents: Collection[str], limit: int, after: str | None = None
    ) -> list[DurableRun]:
        """Up to `limit` running runs whose lease expired and whose agent is none of `agents`
        (what a replica with these agents leaves for another), oldest first (the order they were
        created in), without snapshots; with `after` (the last run of the page before) the next
        page, none once that run is gone."""
        where, args = self._unclaimable(agents)
        limit = check_count(self.name, "limit", limit, low=1, high=MAX_CLAIM)
        p = self.placeholder
        if after is not None:  # keyset: seq is unique and follows creation (a run id's never changes)
            where += f" AND seq > (SELECT seq FROM durable_runs WHERE run_id = {p})"
            args = (*args, check_id(self.name, "run", after))
        sql = f"SELECT {LISTED_COLUMNS} FROM durable_runs WHERE {where} ORDER BY seq LIMIT {p}"
        rows = await self._read(sql, (*args, limit), "listing the durable runs left to other replicas")
        return [durable_run(row, self._moment) for row in rows]

    async def count_unclaimable_durable_runs(self, *, agents: Collection[str]) -> int:
        """How many runs `unclaimable_durable_runs` lists, all its pages together."""
        where, args = self._unclaimable(agents)
        sql = f"SELECT COUNT(*) FROM durable_runs WHERE {where}"
        rows = await self._read(sql, args, "counting the durable runs left to other replicas")
        return int(rows[0][0])

    def _unclaimable(self, agents: Collection[str]) -> tuple[str, tuple[Any, ...]]:
        """The condition of a running run whose lease expired and whose agent is none of `agents`."""
        names = self._names("agent", agents)
        other = f" AND agent_id NOT IN ({', '.join([self.placeholder] * len(names))})" if names else ""
        return f"status = '{RUNNING}' AND lease_expires_at < {self._now}{other}", tuple(names)

    async def release_durable_run(self, run_id: str, *, owner: str, epoch: int) -> None:
        """Give a claimed run up at once, still running (another replica claims it at its next
        look): this one cannot resume it. Errors as for a checkpoint."""
        run_id = check_id(self.name, "run", run_id)
        changes = f"owner = '', lease_expires_at = {self._now}, updated_at = {self._now}"
        await self._while_held(run_id, owner, epoch, changes, (), "releasing")

    async def request_durable_cancel(self, run_id: str) -> DurableRun:
        """Flag a running or suspended run for cancellation; the run, without its snapshot."""
        run_id = check_id(self.name, "run", run_id)
        sql = (
            "UPDATE durable_runs SET cancel_requested = cancel_requested OR status IN "
            f"('{RUNNING}', '{SUSPENDED}') WHERE run_id = {self.placeholder} RETURNING {LISTED_COLUMNS}"
        )
        rows = await self._transact(
            lambda query: query(sql, (run_id,)), f"requesting the cancel of durable run {run_id!r}"
        )
        if not rows:
            raise DurableRunNotFoundError(f"memory store {self.name}: no durable run {label(run_id)}")
        return durable_run(rows[0], self._moment)

    async def get_durable_run(self, run_id: str) -> DurableRun | None:
        """The run with its snapshot, or None."""
        run_id = check_id(self.name, "run", run_id)
        sql = f"SELECT {DURABLE_COLUMNS} FROM durable_runs WHERE run_id = {self.placeholder}"
        rows = await self._read(sql, (run_id,), f"reading durable run {run_id!r}")
        return durable_run(rows[0], self._moment) if rows else None

    async def list_durable_runs(
        self,
        *,
        resource_id: str | None = None,
        agent_id: str | None = None,
        status: str | None = None,
        page: int = 0,
        per_page: int = 20,
    ) -> tuple[list[DurableRun], int]:
        """One page of runs, newest first, without snapshots, and the count of all that match."""
        p = self.placeholder
        where, args = ["1 = 1"], []
        if resource_id is not None:
            where.append(f"resource_id = {p}")
            args.append(check_optional_id(self.name, "resource", resource_id))
        if agent_id is not None:
            where.append(f"agent_id = {p}")
            args.append(check_id(self.name, "agent", agent_id))
        if status is not None:
            where.append(f"status = {p}")
            args.append(check_status(self.name, status, DURABLE_STATUSES))
        size = check_count(self.name, "per_page", per_page, low=1, high=MAX_PAGE)
        number = check_count(self.name, "page", page, low=0, high=2**62 // MAX_PAGE)
        sql = page_sql("durable_runs", LISTED_COLUMNS, " AND ".join(where), "seq", p)
        rows = await self._read(sql, (*args, *args, size, number * size), "listing durable runs")
        return page_of(rows, lambda row: durable_run(row, self._moment))
