"""What every backend is to the shared SQL: a name, a placeholder, and its transactions.

The SQL and methods both backends share (`_threads`, `_suspended`, `_durable`, `_ledger`) are
written once against `StoreHooks`, and so is the loop that applies the migrations; a backend
(`sqlite`, `postgres`) supplies its connection, its transactions, its error translation and the
few SQL fragments in which the two databases differ.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from datetime import datetime
from typing import Any, TypeVar

from procmesh_orchestrator.store.migrations import Backend, migrations

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")
Query = Callable[[str, tuple[Any, ...]], Awaitable[list[Any]]]
"""Runs one statement in the current transaction and returns its rows ([] when it has none)."""


async def shielded(work: Coroutine[Any, Any, T]) -> T:
    """Run a write to its end even when the caller is cancelled (a run's timeout, a client gone).

    The transaction is atomic anyway; finishing it keeps the connection out of a half-open
    transaction that the next caller would inherit. A failure nobody awaits any more is retrieved
    so that asyncio does not report it as lost.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        raise


def page_sql(table: str, columns: str, condition: str, newest: str, p: str) -> str:
    """One page of `table`'s rows that meet `condition`, ordered by the `newest` columns descending,
    each row led by the count of all that match (a page past the end gives one row: the count,
    then NULLs). The arguments are the condition's twice, then LIMIT and OFFSET. A column may be
    ``expression AS name``."""
    names = [col.rsplit(" AS ", 1)[-1] for col in columns.split(", ")]
    order = newest.split(", ")
    selected = ", ".join([columns, *(col for col in order if col not in names)])
    return (
        f"SELECT total.n, {', '.join('run.' + name for name in names)} "
        f"FROM (SELECT count(*) AS n FROM {table} WHERE {condition}) AS total "
        f"LEFT JOIN (SELECT {selected} FROM {table} WHERE {condition} "
        f"ORDER BY {', '.join(col + ' DESC' for col in order)} LIMIT {p} OFFSET {p}) AS run "
        f"ON 1 = 1 ORDER BY {', '.join('run.' + col + ' DESC' for col in order)}"
    )


def page_of(rows: list[Any], make: Callable[[Any], R]) -> tuple[list[R], int]:
    """The items and the total from the rows of a `page_sql` query."""
    total = int(rows[0][0]) if rows else 0
    return [make(row[1:]) for row in rows if row[1] is not None], total


class StoreHooks:
    """What the shared methods need of a backend, and all in which the two differ: its name, its
    placeholder, its clock and locking as SQL fragments, how it renders times, and its reads and
    write transactions."""

    name: str
    """How errors name the store (never a password)."""
    placeholder: str
    """The driver's SQL parameter placeholder (``?``, ``%s``)."""
    _max_bytes: int
    """The largest message (and thread metadata), as JSON."""
    _max_snapshot_bytes: int
    """The largest run snapshot, as JSON."""

    _stamp: str
    """A thread's or a suspended run's write time: the SQL that `_stamp_args` fills (SQLite: a
    parameter, the time taken in the transaction; PostgreSQL: the transaction's ``now()``)."""
    _now: str
    """The database's time, as durable runs and the cost ledger store it (their leases and windows
    are the database's clock, never a replica's)."""
    _lease: str
    """`_now` plus the one parameter `_lease_arg` makes of a duration."""
    _ago: str
    """`_now` minus the one parameter `_ago_arg` makes of a duration."""
    _for_update: str
    """How a transaction locks the row it reads until it commits: `` FOR UPDATE``, or "" where
    the transaction holds the database's write lock from its start (SQLite's BEGIN IMMEDIATE)."""
    _skip_locked: str
    """How a claim of expired leases passes rows another claim holds."""
    _thread_order: str
    """How a thread listing orders threads updated at the same time."""

    def _stamp_args(self) -> tuple[Any, ...]:
        """The parameters `_stamp` takes, made when the transaction writes."""
        raise NotImplementedError

    def _created_at(self, stored: Any) -> str:
        """A stored `_stamp` time as ISO 8601."""
        raise NotImplementedError

    def _time_arg(self, moment: datetime) -> Any:
        """A time as a parameter compared with a stored `_stamp` time."""
        raise NotImplementedError

    def _moment(self, stored: Any) -> str:
        """A stored `_now` time as ISO 8601."""
        raise NotImplementedError

    def _lease_arg(self, seconds: float) -> Any:
        raise NotImplementedError

    def _ago_arg(self, seconds: float) -> Any:
        raise NotImplementedError

    async def _read(self, sql: str, args: tuple[Any, ...], doing: str) -> list[Any]:
        """One statement outside any write transaction; its rows."""
        raise NotImplementedError

    async def _transact(
        self, work: Callable[[Query], Awaitable[T]], doing: str, thread: tuple[str, str] | None = None
    ) -> T:
        """`work` in one write transaction, committed, or rolled back when it raises; it runs its
        statements through the `Query` it is given. With a `thread` key (``(resource_id,
        thread_id)``), after this process's earlier writes to that thread."""
        raise NotImplementedError

    async def _execute(self, sql: str, args: tuple[Any, ...], doing: str) -> None:
        """One statement in one write transaction."""
        await self._transact(lambda query: query(sql, args), doing)

    async def _apply_migrations(
        self, query: Query, backend: Backend, run_script: Callable[[str], Awaitable[None]]
    ) -> None:
        """In the caller's transaction, once ``schema_version`` exists: apply the backend's
        migrations it does not list yet (`run_script` runs one file's statements), each with its
        version row; a schema newer than this build is logged, not refused (a rolling deploy)."""
        applied = {row[0] for row in await query("SELECT version FROM schema_version", ())}
        known = migrations(backend)
        if applied and max(applied) > len(known):
            log.warning(
                "memory store %s: schema version %d is newer than this build's", self.name, max(applied)
            )
        p = self.placeholder
        record = f"INSERT INTO schema_version (version, name, applied_at) VALUES ({p}, {p}, {self._stamp})"
        for migration in known:
            if migration.version in applied:
                continue
            await run_script(migration.sql)
            await query(record, (migration.version, migration.name, *self._stamp_args()))
            log.info(
                "memory store %s: applied migration %04d_%s", self.name, migration.version, migration.name
            )
