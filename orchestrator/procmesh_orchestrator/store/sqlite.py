"""The default memory store: one SQLite file, nothing to install.

WAL mode lets readers in other processes (``procmesh memory``) read while a run writes; the busy
timeout makes a second writer process wait for the lock instead of failing; foreign keys make a
deleted thread take its messages along. Each write is one ``BEGIN IMMEDIATE`` transaction, which
takes the write lock up front, so two processes never both read "no such thread" and then both
insert. In one process, one connection serves every call, and a lock keeps the transactions of
concurrent runs from interleaving on it. Durable runs' lease times are SQLite's clock
(``strftime('%Y-%m-%dT%H:%M:%fZ', 'now')``), and a claim of expired leases reads and updates them in
one BEGIN IMMEDIATE transaction, so two processes never claim the same run.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from procmesh_orchestrator.errors import (
    MemoryStoreError,
    StoreUnavailableError,
    ThreadNotFoundError,
)
from procmesh_orchestrator.store._checks import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_SNAPSHOT_BYTES,
    MAX_PAGE,
    check_count,
    check_id,
    decode,
    iso_from_text,
    label,
    now_text,
    time_text,
)
from procmesh_orchestrator.store._durable import DurableRunMethods, check_fence, hold_fence, hold_turn
from procmesh_orchestrator.store._ledger import CostMethods
from procmesh_orchestrator.store._sql import Query, shielded
from procmesh_orchestrator.store._suspended import (
    SuspendedRunMethods,
    claimed_run,
    encode_suspended,
    save_suspended_sql,
    select_suspended_sql,
    set_status_sql,
)
from procmesh_orchestrator.store._threads import check_thread_fields, encode_turn, messages_query, thread_key
from procmesh_orchestrator.store.migrations import migrations
from procmesh_orchestrator.store.runs import RESUMING, RunFence, SuspendedRun
from procmesh_orchestrator.store.threads import Message, Thread

log = logging.getLogger(__name__)
T = TypeVar("T")

# SQLite result codes that mean the file cannot be used right now, rather than a bad statement.
_UNAVAILABLE = {
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_CANTOPEN",
    "SQLITE_IOERR",
    "SQLITE_FULL",
    "SQLITE_READONLY",
    "SQLITE_PERM",
    "SQLITE_CORRUPT",
    "SQLITE_NOTADB",
}
_THREAD_COLUMNS = "thread_id, resource_id, title, metadata, created_at, updated_at"
_CLOCK = "%Y-%m-%dT%H:%M:%fZ"
"""The database's time as durable runs store it: ISO 8601 to the millisecond, fixed width."""


class SqliteMemoryStore(SuspendedRunMethods, DurableRunMethods, CostMethods):
    """Memory in one SQLite file (created with its folder when missing)."""

    placeholder = "?"
    _now = f"strftime('{_CLOCK}', 'now')"
    _lease = f"strftime('{_CLOCK}', 'now', ?)"
    _skip_locked = ""  # BEGIN IMMEDIATE: a claim holds the file's write lock from its first read
    _ago = f"strftime('{_CLOCK}', 'now', ?)"
    _for_update = ""  # BEGIN IMMEDIATE: an admission holds the file's write lock from its first read

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
    ) -> None:
        self.path = Path(path)
        self.name = f"sqlite:{self.path}"
        """How errors name this store."""
        self._busy_timeout = busy_timeout
        self._max_bytes = max_message_bytes
        self._max_snapshot_bytes = max_snapshot_bytes
        self._db: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Open the file (WAL, busy timeout, foreign keys) and apply pending migrations."""
        with self._errors("opening the database"):
            await asyncio.to_thread(self.path.parent.mkdir, parents=True, exist_ok=True)
            db = await aiosqlite.connect(self.path, timeout=self._busy_timeout, isolation_level=None)
            try:
                await db.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
                await self._enable_wal(db)
                await db.execute("PRAGMA foreign_keys = ON")
                # FULL: a committed turn survives a power cut, not only a killed process.
                await db.execute("PRAGMA synchronous = FULL")
                self._db = db
                await self._write(self._migrate, "applying migrations")
            except BaseException:
                self._db = None
                await db.close()
                raise

    async def _enable_wal(self, db: aiosqlite.Connection) -> None:
        """Switch the file to WAL (persistent: later opens find it so).

        The switch needs the file to itself, and SQLite answers SQLITE_BUSY at once, without its
        busy handler, when another process is switching or migrating at the same moment (several
        replicas starting together), so it is retried here within the busy timeout.
        """
        deadline = asyncio.get_running_loop().time() + self._busy_timeout
        while True:
            try:
                async with db.execute("PRAGMA journal_mode = WAL") as cursor:
                    mode = await cursor.fetchone()
                break
            except sqlite3.OperationalError as exc:
                if not _unavailable(exc) or asyncio.get_running_loop().time() >= deadline:
                    raise
                await asyncio.sleep(0.02)
        if mode is None or str(mode[0]).lower() != "wal":
            raise StoreUnavailableError(f"memory store {self.name}: WAL mode refused ({mode})")

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        db, self._db = self._db, None
        if db is not None:
            async with self._lock:
                await db.close()

    async def get_thread(self, thread_id: str, resource_id: str) -> Thread | None:
        """The resource's thread of this id, or None."""
        key = self._key(thread_id, resource_id)
        rows = await self._read(
            f"SELECT {_THREAD_COLUMNS} FROM threads WHERE resource_id = ? AND thread_id = ?",
            key,
            f"reading thread {thread_id!r}",
        )
        return _thread(rows[0]) if rows else None

    async def create_thread(self, thread: Thread) -> Thread:
        """Create it; the same id of the same resource is returned as stored."""
        resource_id, thread_id = self._key(thread.id, thread.resource_id)
        title, metadata = check_thread_fields(self.name, thread.title, thread.metadata, self._max_bytes)

        async def create(db: aiosqlite.Connection) -> Thread:
            now = now_text()
            # The write lock is held from BEGIN IMMEDIATE: the insert and the read see one state.
            await db.execute(
                "INSERT INTO threads (resource_id, thread_id, title, metadata, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (resource_id, thread_id) DO NOTHING",
                (resource_id, thread_id, title, metadata, now, now),
            )
            found = await _fetch(
                db,
                f"SELECT {_THREAD_COLUMNS} FROM threads WHERE resource_id = ? AND thread_id = ?",
                (resource_id, thread_id),
            )
            return _thread(found[0])

        return await self._write(create, f"creating thread {thread_id!r}")

    async def list_threads(self, resource_id: str, *, limit: int = 100, offset: int = 0) -> list[Thread]:
        """The resource's threads, most recently updated first."""
        resource_id = check_id(self.name, "resource", resource_id)
        limit = check_count(self.name, "limit", limit, low=1, high=MAX_PAGE)
        offset = check_count(self.name, "offset", offset, low=0, high=2**62)
        rows = await self._read(
            f"SELECT {_THREAD_COLUMNS} FROM threads WHERE resource_id = ? "
            "ORDER BY updated_at DESC, rowid DESC LIMIT ? OFFSET ?",
            (resource_id, limit, offset),
            f"listing the threads of resource {resource_id!r}",
        )
        return [_thread(row) for row in rows]

    async def update_thread(
        self,
        thread_id: str,
        resource_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Thread:
        """Change title and/or metadata (`ThreadNotFoundError` when the resource has no such thread)."""
        key = self._key(thread_id, resource_id)
        new_title, new_metadata = check_thread_fields(
            self.name, "" if title is None else title, {} if metadata is None else metadata, self._max_bytes
        )

        async def update(db: aiosqlite.Connection) -> Thread:
            rows = await _fetch(
                db,
                "UPDATE threads SET title = COALESCE(?, title), metadata = COALESCE(?, metadata), "
                "updated_at = ? WHERE resource_id = ? AND thread_id = ? "
                f"RETURNING {_THREAD_COLUMNS}",
                (
                    None if title is None else new_title,
                    None if metadata is None else new_metadata,
                    now_text(),
                    *key,
                ),
            )
            if not rows:
                raise ThreadNotFoundError(f"memory store {self.name}: no thread {label(thread_id)}")
            return _thread(rows[0])

        return await self._write(update, f"updating thread {thread_id!r}")

    async def delete_thread(self, thread_id: str, resource_id: str) -> None:
        """Delete the resource's thread and (by the foreign key's cascade) its messages."""
        key = self._key(thread_id, resource_id)

        async def delete(db: aiosqlite.Connection) -> None:
            await db.execute("DELETE FROM threads WHERE resource_id = ? AND thread_id = ?", key)

        await self._write(delete, f"deleting thread {thread_id!r}")

    async def save_turn(
        self, thread_id: str, resource_id: str, messages: list[Message], *, fence: RunFence | None = None
    ) -> None:
        """Append (or replace by id) the turn's messages to the resource's thread, in one
        transaction; a durable run's (`fence`) only at its epoch, once per run (`hold_turn`)."""
        key = self._key(thread_id, resource_id)
        rows = encode_turn(self.name, thread_id, resource_id, messages, self._max_bytes)
        held = None if fence is None else check_fence(self.name, fence)

        async def save(db: aiosqlite.Connection) -> None:
            if held is not None:  # first: the write lock is held from BEGIN IMMEDIATE on
                await hold_turn(self.name, partial(_fetch, db), held, "?", "", key, [r[0] for r in rows])
            now = now_text()
            # The resource's thread, created or touched: another resource's of this id is another row.
            await db.execute(
                "INSERT INTO threads (resource_id, thread_id, created_at, updated_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (resource_id, thread_id) DO UPDATE SET updated_at = excluded.updated_at",
                (*key, now, now),
            )
            # An id already in the thread keeps its place (its seq) and takes the new body.
            await db.executemany(
                "INSERT INTO messages (resource_id, thread_id, id, role, body) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (resource_id, thread_id, id) "
                "DO UPDATE SET role = excluded.role, body = excluded.body",
                [(*key, *row) for row in rows],
            )

        await self._write(save, f"saving a turn to thread {thread_id!r}")

    async def messages(
        self, thread_id: str, resource_id: str, *, last: int | None = None, include_signals: bool = True
    ) -> list[Message]:
        """The resource's thread's stored messages, oldest first: all, or the `last` N."""
        resource_id, thread_id = self._key(thread_id, resource_id)
        sql, args = messages_query(self.name, thread_id, resource_id, last, include_signals, "?")
        rows = await self._read(sql, args, f"reading the messages of thread {thread_id!r}")
        return [decode(row[0]) for row in rows]

    def _key(self, thread_id: object, resource_id: object) -> tuple[str, str]:
        """A thread's key, ``(resource_id, thread_id)``, both ids checked."""
        return thread_key(self.name, thread_id, resource_id)

    async def save_suspended(self, run: SuspendedRun, *, fence: RunFence | None = None) -> None:
        """Save the run (replacing one of its id) as `SUSPENDED` (a durable run's: at its epoch)."""
        row = encode_suspended(self.name, run, self._max_snapshot_bytes)
        held = None if fence is None else check_fence(self.name, fence)

        async def save(db: aiosqlite.Connection) -> None:
            if held is not None:
                await hold_fence(self.name, partial(_fetch, db), held, "?", "", "suspending")
            await db.execute(save_suspended_sql("?", "?"), (*row, now_text()))

        await self._write(save, f"saving suspended run {row[0]!r}")

    async def claim_suspended(
        self, run_id: str, tool_call_id: str, *, resource_id: str | None = None
    ) -> SuspendedRun:
        """Mark the run `RESUMING` and return it, in one BEGIN IMMEDIATE transaction."""
        run_id = check_id(self.name, "run", run_id)
        tool_call_id = check_id(self.name, "tool call", tool_call_id)

        async def claim(db: aiosqlite.Connection) -> SuspendedRun:
            # The write lock is held from BEGIN IMMEDIATE: no other claim reads between these two.
            rows = await _fetch(db, select_suspended_sql("?"), (run_id,))
            run = claimed_run(self.name, run_id, tool_call_id, rows, iso_from_text, resource_id)
            await db.execute(set_status_sql("?", RESUMING), (run_id,))
            return run

        return await self._write(claim, f"claiming suspended run {run_id!r}")

    def _created_at(self, stored: Any) -> str:
        return iso_from_text(stored)

    def _time_arg(self, moment: datetime) -> Any:
        return time_text(moment)

    def _lease_arg(self, seconds: float) -> Any:
        return f"+{seconds:.6f} seconds"  # a strftime modifier

    def _ago_arg(self, seconds: float) -> Any:
        return f"-{seconds:.6f} seconds"  # a strftime modifier

    def _moment(self, stored: Any) -> str:
        return str(stored)  # stored as _CLOCK writes it, which is already the ISO 8601 we report

    async def _execute(self, sql: str, args: tuple[Any, ...], doing: str) -> None:
        """One statement in one write transaction."""

        async def execute(db: aiosqlite.Connection) -> None:
            await db.execute(sql, args)

        await self._write(execute, doing)

    async def _transact(self, work: Callable[[Query], Awaitable[T]], doing: str) -> T:
        """`work`'s statements in one BEGIN IMMEDIATE transaction."""
        return await self._write(lambda db: work(partial(_fetch, db)), doing)

    async def _migrate(self, db: aiosqlite.Connection) -> None:
        await db.execute(
            "CREATE TABLE IF NOT EXISTS schema_version "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        applied = {row[0] for row in await _fetch(db, "SELECT version FROM schema_version", ())}
        known = migrations("sqlite")
        if applied and max(applied) > len(known):
            log.warning(
                "memory store %s: schema version %d is newer than this build's", self.name, max(applied)
            )
        for migration in known:
            if migration.version in applied:
                continue
            for statement in _statements(migration.sql):
                await db.execute(statement)
            await db.execute(
                "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                (migration.version, migration.name, now_text()),
            )
            log.info(
                "memory store %s: applied migration %04d_%s", self.name, migration.version, migration.name
            )

    async def _write(self, work: Callable[[aiosqlite.Connection], Awaitable[T]], doing: str) -> T:
        """`work` in one BEGIN IMMEDIATE transaction, committed, or rolled back on any failure."""
        db = self._connection()

        async def transaction() -> T:
            async with self._lock:
                with self._errors(doing):
                    await db.execute("BEGIN IMMEDIATE")
                    try:
                        result = await work(db)
                        await db.execute("COMMIT")
                    except BaseException:
                        if db.in_transaction:
                            await db.execute("ROLLBACK")
                        raise
                    return result

        return await shielded(transaction())

    async def _read(self, sql: str, args: tuple[Any, ...], doing: str) -> list[Any]:
        db = self._connection()
        async with self._lock:
            with self._errors(doing):
                return await _fetch(db, sql, args)

    def _connection(self) -> aiosqlite.Connection:
        if self._db is None:
            raise StoreUnavailableError(f"memory store {self.name} is not started (or closed)")
        return self._db

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """sqlite3's errors as the store's: a file that cannot be used now is unavailable."""
        try:
            yield
        except MemoryStoreError:
            raise
        except sqlite3.Error as exc:
            kind = StoreUnavailableError if _unavailable(exc) else MemoryStoreError
            raise kind(f"memory store {self.name}: {doing}: {exc}") from exc
        except (OSError, ValueError) as exc:  # a folder we cannot create; aiosqlite's "no active connection"
            raise StoreUnavailableError(f"memory store {self.name}: {doing}: {exc}") from exc


def _unavailable(exc: sqlite3.Error) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    return any(name.startswith(code) for code in _UNAVAILABLE)


async def _fetch(db: aiosqlite.Connection, sql: str, args: tuple[Any, ...]) -> list[Any]:
    async with db.execute(sql, args) as cursor:
        return list(await cursor.fetchall())


def _statements(script: str) -> list[str]:
    """A migration file's statements (sqlite3 decides where each is complete, comments included)."""
    statements, pending = [], ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if pending.strip() and not all(
        part.strip().startswith("--") or not part.strip() for part in pending.splitlines()
    ):
        raise MemoryStoreError(f"an incomplete statement ends a SQLite migration: {pending.strip()[:80]!r}")
    return statements


def _thread(row: Any) -> Thread:
    thread_id, resource_id, title, metadata, created_at, updated_at = row
    return Thread(
        id=thread_id,
        resource_id=resource_id,
        title=title,
        metadata=decode(metadata),
        created_at=iso_from_text(created_at),
        updated_at=iso_from_text(updated_at),
    )
