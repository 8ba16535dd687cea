"""Suspended runs in both stores: the same SQL given the backend's placeholder and clock."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from procmesh_orchestrator.errors import (
    InvalidMemoryInputError,
    ResumeConflictError,
    SuspendedRunNotFoundError,
)
from procmesh_orchestrator.store._checks import (
    MAX_PAGE,
    check_count,
    check_date,
    check_id,
    check_optional_id,
    decode,
    encode_json,
    encode_snapshot,
    label,
    run_owners,
)
from procmesh_orchestrator.store._durable import check_fence, hold_fence
from procmesh_orchestrator.store._sql import Query, StoreHooks, page_of, page_sql
from procmesh_orchestrator.store.runs import RESUMED, RESUMING, SUSPENDED, RunFence, SuspendedRun

MAX_TOOL_CALLS = 1024
"""Most tool calls one suspended run may await."""
SUSPENDED_COLUMNS = "run_id, agent_id, thread_id, resource_id, tool_call_ids, snapshot, status, created_at"


def encode_suspended(store: str, run: object, max_bytes: int) -> tuple[str, str, str, str, str, str]:
    """A run to save as ``(run_id, agent_id, thread_id, resource_id, tool_call_ids, snapshot)``
    (the last two as JSON text), every field checked before anything is written."""
    if not isinstance(run, SuspendedRun):
        raise InvalidMemoryInputError(
            f"memory store {store}: a suspended run is a SuspendedRun, not {type(run).__name__}"
        )
    run_id = check_id(store, "run", run.run_id)
    where = f"suspended run {label(run_id)}"
    calls = run.tool_call_ids
    if not isinstance(calls, tuple | list) or not 1 <= len(calls) <= MAX_TOOL_CALLS:
        raise InvalidMemoryInputError(
            f"memory store {store}: {where}: tool_call_ids must be a tuple of 1 to {MAX_TOOL_CALLS} ids"
        )
    checked = [check_id(store, f"{where}: tool call", call) for call in calls]
    agent_id, thread_id, resource_id = run_owners(store, where, run)
    tool_call_ids = encode_json(store, f"{where}: tool_call_ids", checked, max_bytes)
    snapshot = encode_snapshot(store, where, run.snapshot, max_bytes)
    return run_id, agent_id, thread_id, resource_id, tool_call_ids, snapshot


def save_suspended_sql(p: str, created_at: str) -> str:
    """Insert a run, or replace the one of its id (claimed or not) with a fresh suspension."""
    return (
        f"INSERT INTO suspended_runs ({SUSPENDED_COLUMNS}) "
        f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, '{SUSPENDED}', {created_at}) "
        "ON CONFLICT (run_id) DO UPDATE SET agent_id = excluded.agent_id, "
        "thread_id = excluded.thread_id, resource_id = excluded.resource_id, "
        "tool_call_ids = excluded.tool_call_ids, snapshot = excluded.snapshot, "
        "status = excluded.status, created_at = excluded.created_at"
    )


def select_suspended_sql(p: str) -> str:
    """Read one run by id."""
    return f"SELECT {SUSPENDED_COLUMNS} FROM suspended_runs WHERE run_id = {p}"


def set_status_sql(p: str, status: str) -> str:
    """Move a run to `status` (a release only touches a claimed run)."""
    only = f" AND status = '{RESUMING}'" if status == SUSPENDED else ""
    return f"UPDATE suspended_runs SET status = '{status}' WHERE run_id = {p}{only}"


def suspended_run(row: Any, when: Callable[[Any], str]) -> SuspendedRun:
    """A stored row as a run; `when` renders the backend's ``created_at`` as ISO 8601."""
    run_id, agent_id, thread_id, resource_id, tool_call_ids, snapshot, status, created_at = row
    return SuspendedRun(
        run_id=run_id,
        agent_id=agent_id,
        thread_id=thread_id,
        resource_id=resource_id,
        tool_call_ids=tuple(decode(tool_call_ids)),
        snapshot=decode(snapshot),
        created_at=when(created_at),
        status=status,
    )


def claimed_run(
    store: str,
    run_id: str,
    tool_call_id: str | None,
    rows: list[Any],
    when: Callable[[Any], str],
    resource_id: str | None = None,
) -> SuspendedRun:
    """The run a claim takes, from its row as read under the write lock: it must exist (and be
    `resource_id`'s, when given: another resource's is missing, whatever its state), await
    `tool_call_id` (None: its only awaited call, as `@mastra/client-js` resumes without one) and
    not be claimed already. The caller then marks it `RESUMING`."""
    run = suspended_run(rows[0], when) if rows else None
    if run is None or (resource_id is not None and run.resource_id != resource_id):
        raise SuspendedRunNotFoundError(f"memory store {store}: no suspended run {label(run_id)}")
    if tool_call_id is None:
        if len(run.tool_call_ids) != 1:
            raise InvalidMemoryInputError(
                f"memory store {store}: suspended run {label(run_id)} awaits {len(run.tool_call_ids)} "
                f"tool calls ({', '.join(run.tool_call_ids)}): name one with toolCallId"
            )
        tool_call_id = run.tool_call_ids[0]
    if tool_call_id not in run.tool_call_ids:
        raise SuspendedRunNotFoundError(
            f"memory store {store}: suspended run {label(run_id)} awaits no tool call {label(tool_call_id)}"
        )
    if run.status != SUSPENDED:
        doing = "was already resumed" if run.status == RESUMED else "is already being resumed"
        raise ResumeConflictError(f"memory store {store}: suspended run {label(run_id)} {doing}")
    return replace(run, status=RESUMING)


_MS = timedelta(milliseconds=1)


def _millisecond(moment: datetime) -> datetime:
    """The start of `moment`'s millisecond."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


def list_suspended_query(
    store: str,
    agent_id: object,
    filters: Mapping[str, object],
    page: object,
    per_page: object,
    placeholder: str,
    moment: Callable[[datetime], Any],
) -> tuple[str, tuple[Any, ...]]:
    """The SQL and arguments that read one page of an agent's runs, newest first, each row led by
    the count of all that match (a page past the end gives one row: the count, then NULLs).

    `filters` holds ``thread_id``, ``resource_id``, ``from_date`` and ``to_date``; `moment` turns a
    bound into the backend's ``created_at`` parameter. Both bounds are inclusive of ``created_at``
    as the store reports it (`iso`, to the millisecond, while it stores microseconds), so a run's
    own ``created_at`` given as either bound selects it.
    """
    p = placeholder
    where, args = [f"agent_id = {p}", f"status <> '{RESUMED}'"], [check_id(store, "agent", agent_id)]
    for kind in ("thread", "resource"):
        value = filters.get(f"{kind}_id")
        if value is not None:
            where.append(f"{kind}_id = {p}")
            args.append(check_optional_id(store, kind, value))
    low, high = (
        check_date(store, "from_date", filters.get("from_date")),
        check_date(store, "to_date", filters.get("to_date")),
    )
    if low is not None:  # reported >= low: stored from the first whole millisecond at or after low
        first = _millisecond(low)
        where.append(f"created_at >= {p}")
        args.append(moment(first if first == low else first + _MS))
    if high is not None:  # reported <= high: stored before the end of high's millisecond
        where.append(f"created_at < {p}")
        args.append(moment(_millisecond(high) + _MS))
    size = check_count(store, "per_page", per_page, low=1, high=MAX_PAGE)
    number = check_count(store, "page", page, low=0, high=2**62 // MAX_PAGE)
    sql = page_sql("suspended_runs", SUSPENDED_COLUMNS, " AND ".join(where), "created_at, run_id", p)
    return sql, (*args, *args, size, number * size)


class SuspendedRunMethods(StoreHooks):
    """The suspended-run methods, the same SQL on both backends given the backend's placeholder,
    its write time (`_stamp`) and its row locks (`_for_update`)."""

    async def save_suspended(self, run: SuspendedRun, *, fence: RunFence | None = None) -> None:
        """Save the run (replacing one of its id) as `SUSPENDED` (a durable run's: at its epoch)."""
        row = encode_suspended(self.name, run, self._max_snapshot_bytes)
        held = None if fence is None else check_fence(self.name, fence)
        p = self.placeholder

        async def save(query: Query) -> None:
            if held is not None:  # first: the run's row stays locked until the save commits
                await hold_fence(self.name, query, held, p, self._for_update, "suspending")
            await query(save_suspended_sql(p, self._stamp), (*row, *self._stamp_args()))

        await self._transact(save, f"saving suspended run {row[0]!r}")

    async def claim_suspended(
        self, run_id: str, tool_call_id: str | None, *, resource_id: str | None = None
    ) -> SuspendedRun:
        """Mark the run `RESUMING` and return it, its row locked from the read to the commit (or
        the write lock held from BEGIN IMMEDIATE): of concurrent claims, each after the first finds
        it claimed."""
        run_id = check_id(self.name, "run", run_id)
        if tool_call_id is not None:
            tool_call_id = check_id(self.name, "tool call", tool_call_id)
        p = self.placeholder

        async def claim(query: Query) -> SuspendedRun:
            rows = await query(select_suspended_sql(p) + self._for_update, (run_id,))
            run = claimed_run(self.name, run_id, tool_call_id, rows, self._created_at, resource_id)
            await query(set_status_sql(p, RESUMING), (run_id,))
            return run

        return await self._transact(claim, f"claiming suspended run {run_id!r}")

    async def suspended_run_exists(self, run_id: str) -> bool:
        """Whether a run of this id was suspended here (awaiting, resuming or resumed)."""
        run_id = check_id(self.name, "run", run_id)
        sql = f"SELECT 1 FROM suspended_runs WHERE run_id = {self.placeholder}"
        return bool(await self._read(sql, (run_id,), f"reading suspended run {run_id!r}"))

    async def release_suspended(self, run_id: str) -> None:
        """Put a claimed run back to `SUSPENDED`."""
        run_id = check_id(self.name, "run", run_id)
        sql = set_status_sql(self.placeholder, SUSPENDED)
        await self._execute(sql, (run_id,), f"releasing suspended run {run_id!r}")

    async def finish_suspended(self, run_id: str) -> None:
        """The resumed run ended: drop its snapshot, keep its id as `RESUMED` (a late decision on
        it is then a conflict, not a run that never was)."""
        run_id = check_id(self.name, "run", run_id)
        sql = (
            f"UPDATE suspended_runs SET status = '{RESUMED}', snapshot = '{{}}' "
            f"WHERE run_id = {self.placeholder}"
        )
        await self._execute(sql, (run_id,), f"finishing suspended run {run_id!r}")

    async def delete_suspended(self, run_id: str) -> None:
        """Forget the run."""
        run_id = check_id(self.name, "run", run_id)
        sql = f"DELETE FROM suspended_runs WHERE run_id = {self.placeholder}"
        await self._execute(sql, (run_id,), f"deleting suspended run {run_id!r}")

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
        """One page of the agent's runs, newest first, and the count of all that match."""
        filters = {
            "thread_id": thread_id,
            "resource_id": resource_id,
            "from_date": from_date,
            "to_date": to_date,
        }
        sql, args = list_suspended_query(
            self.name, agent_id, filters, page, per_page, self.placeholder, self._time_arg
        )
        rows = await self._read(sql, args, f"listing the suspended runs of agent {agent_id!r}")
        return page_of(rows, lambda row: suspended_run(row, self._created_at))
