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
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from procmesh_orchestrator.errors import MemoryStoreError, StoreUnavailableError
from procmesh_orchestrator.store._checks import (
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_MAX_SNAPSHOT_BYTES,
    iso_from_text,
    now_text,
    time_text,
)
from procmesh_orchestrator.store._decisions import DecisionMethods
from procmesh_orchestrator.store._durable import DurableRunMethods
from procmesh_orchestrator.store._ledger import CostMethods
from procmesh_orchestrator.store._sql import Query, shielded
from procmesh_orchestrator.store._suspended import SuspendedRunMethods
from procmesh_orchestrator.store._threads import ThreadMethods
from procmesh_orchestrator.store._working_memory import WorkingMemoryMethods

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
_CLOCK = "%Y-%m-%dT%H:%M:%fZ"
"""The database's time as durable runs store it: ISO 8601 to the millisecond, fixed width."""


class SqliteMemoryStore(
    ThreadMethods,
    SuspendedRunMethods,
    DurableRunMethods,
    CostMethods,
    WorkingMemoryMethods,
    DecisionMethods,
):
    """Memory in one SQLite file (created with its folder when missing)."""

    placeholder = "?"
    _stamp = "?"  # the time Python takes in the transaction, to the microsecond (`now_text`)
    _now = f"strftime('{_CLOCK}', 'now')"
    _lease = f"strftime('{_CLOCK}', 'now', ?)"
    _ago = f"strftime('{_CLOCK}', 'now', ?)"
    # BEGIN IMMEDIATE: every write transaction holds the file's write lock from its first read
    _for_update = ""
    _skip_locked = ""
    _thread_order = "rowid DESC"

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

    def _stamp_args(self) -> tuple[Any, ...]:
        return (now_text(),)

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

    async def _transact(
        self, work: Callable[[Query], Awaitable[T]], doing: str, thread: tuple[str, str] | None = None
    ) -> T:
        """`work`'s statements in one BEGIN IMMEDIATE transaction (this process's one lock orders
        every write, whatever its `thread`)."""
        return await self._write(lambda db: work(partial(_fetch, db)), doing)

    async def _migrate(self, db: aiosqlite.Connection) -> None:
        await db.execute(
            "CREATE TABLE IF NOT EXISTS schema_version "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )

        async def run_script(script: str) -> None:
            for statement in _statements(script):
                await db.execute(statement)

        await self._apply_migrations(partial(_fetch, db), "sqlite", run_script)

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
