"""Memory on PostgreSQL, for several orchestrator replicas sharing one database.

psycopg 3 async through an `AsyncConnectionPool` (each connection checked before use, so a restarted
server costs a reconnect, not a failed run). Every write is one transaction. Concurrent writers to
one thread, in any number of processes, are serialized by the thread row's lock: ``save_turn``
starts with ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``, which inserts the thread or locks
the existing row until commit, so the next writer's messages take their sequence numbers after
this turn's. A claim of a suspended run reads it ``FOR UPDATE``: concurrent claims queue on the row,
and each after the first finds it claimed. A claim of expired durable runs selects them ``FOR UPDATE
SKIP LOCKED`` and updates them in the same transaction: concurrent claims take disjoint runs, and
lease times are the server's ``now()``, whatever the replicas' clocks say. Migrations run under a
transaction-scoped advisory lock, so replicas that start at the same moment apply each migration once.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

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
    iso,
    label,
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
Connection = psycopg.AsyncConnection[tuple[Any, ...]]

MIGRATION_LOCK = 0x70726F636D657368  # "procmesh" in ASCII: the advisory lock key of start-up migrations
_THREAD_COLUMNS = "thread_id, resource_id, title, metadata, created_at, updated_at"


class PostgresMemoryStore(SuspendedRunMethods, DurableRunMethods, CostMethods):
    """Memory in a PostgreSQL database given by a libpq DSN (``postgresql://...`` or ``key=value``)."""

    placeholder = "%s"
    _now = "now()"
    _lease = "now() + make_interval(secs => %s)"
    _skip_locked = " FOR UPDATE SKIP LOCKED"  # concurrent claims take disjoint runs, nobody waits
    _ago = "now() - make_interval(secs => %s)"
    _for_update = " FOR UPDATE"  # concurrent admissions of one scope queue on its row

    def __init__(
        self,
        dsn: str,
        *,
        min_connections: int = 1,
        max_connections: int = 10,
        timeout: float = 5.0,
        idle_transaction_timeout: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_snapshot_bytes: int = DEFAULT_MAX_SNAPSHOT_BYTES,
    ) -> None:
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            # The parser's message may quote the DSN, password included: say only that it is malformed.
            raise MemoryStoreError("memory store postgres: the DSN is malformed") from exc
        self.name = _describe(params)
        """How errors name this store: host, port and database, never the user or password."""
        self._dsn = dsn
        self._secret = str(params.get("password") or "")
        self._timeout = timeout
        self._idle_ms = max(1, round(idle_transaction_timeout * 1000))
        """The server ends a session idle inside a transaction for this long: a replica frozen in
        the middle of one (SIGSTOP, a long pause) holds its row locks, and a durable run whose row
        it locked could not be taken over until it woke."""
        self._max_bytes = max_message_bytes
        self._max_snapshot_bytes = max_snapshot_bytes
        self._pool: AsyncConnectionPool[Connection] | None = None
        self._sizes = (min_connections, max_connections)
        # Writes of this process to one thread take turns here first (FIFO), so they commit in the
        # order they were made, even a write that outlives its cancelled caller (shielded); the
        # row lock then orders them against other processes'. Unused locks go away by themselves.
        self._thread_locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    async def start(self) -> None:
        """Open the pool (waiting up to the timeout for a first connection) and migrate."""
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self._dsn,
            min_size=self._sizes[0],
            max_size=self._sizes[1],
            timeout=self._timeout,
            open=False,
            check=AsyncConnectionPool.check_connection,
            configure=self._configure,
            kwargs={"autocommit": True, "connect_timeout": max(1, round(self._timeout))},
            name=self.name,
        )
        try:
            with self._errors("connecting"):
                try:
                    await pool.open(wait=True, timeout=self._timeout)
                except PoolTimeout:  # says only "pool initialization incomplete": ask once why
                    raise await self._why_no_connection() from None
            self._pool = pool
            await self._write(self._migrate, "applying migrations")
        except BaseException:
            self._pool = None
            await pool.close()
            raise

    async def _why_no_connection(self) -> StoreUnavailableError:
        """Why the pool got no connection at start, from one direct attempt: a wrong password,
        user, database, host or port each says which (never the password itself)."""
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._dsn, autocommit=True, connect_timeout=max(1, round(self._timeout))
            )
        except psycopg.Error as exc:
            reason = connect_failure(self._scrub(exc), str(exc))
        else:
            await conn.close()
            reason = f"no connection within {self._timeout:g}s (the pool's timeout)"
        return StoreUnavailableError(f"memory store {self.name} is unavailable: connecting: {reason}")

    async def _configure(self, conn: Connection) -> None:
        """Each new connection: the server ends it when it sits idle inside a transaction longer
        than `idle_transaction_timeout` (every transaction here is a tight run of statements)."""
        await conn.execute(f"SET idle_in_transaction_session_timeout = {int(self._idle_ms)}")

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def get_thread(self, thread_id: str, resource_id: str) -> Thread | None:
        """The resource's thread of this id, or None."""
        key = thread_key(self.name, thread_id, resource_id)
        rows = await self._read(
            f"SELECT {_THREAD_COLUMNS} FROM threads WHERE resource_id = %s AND thread_id = %s",
            key,
            f"reading thread {thread_id!r}",
        )
        return _thread(rows[0]) if rows else None

    async def create_thread(self, thread: Thread) -> Thread:
        """Create it; the same id of the same resource is returned as stored."""
        key = thread_key(self.name, thread.id, thread.resource_id)
        title, metadata = check_thread_fields(self.name, thread.title, thread.metadata, self._max_bytes)

        async def create(conn: Connection) -> Thread:
            # One statement inserts the thread or, on an existing id of this resource, locks and
            # returns it unchanged (a no-op update): no window in which a concurrent delete leaves neither.
            cursor = await conn.execute(
                "INSERT INTO threads (resource_id, thread_id, title, metadata) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (resource_id, thread_id) DO UPDATE SET title = threads.title "
                f"RETURNING {_THREAD_COLUMNS}",
                (*key, title, metadata),
            )
            row = await cursor.fetchone()
            assert row is not None  # INSERT ... ON CONFLICT DO UPDATE always returns the row
            return _thread(row)

        return await self._write(create, f"creating thread {key[1]!r}", key)

    async def list_threads(self, resource_id: str, *, limit: int = 100, offset: int = 0) -> list[Thread]:
        """The resource's threads, most recently updated first."""
        resource_id = check_id(self.name, "resource", resource_id)
        limit = check_count(self.name, "limit", limit, low=1, high=MAX_PAGE)
        offset = check_count(self.name, "offset", offset, low=0, high=2**62)
        rows = await self._read(
            f"SELECT {_THREAD_COLUMNS} FROM threads WHERE resource_id = %s "
            "ORDER BY updated_at DESC, thread_id LIMIT %s OFFSET %s",
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
        key = thread_key(self.name, thread_id, resource_id)
        new_title, new_metadata = check_thread_fields(
            self.name, "" if title is None else title, {} if metadata is None else metadata, self._max_bytes
        )

        async def update(conn: Connection) -> Thread:
            cursor = await conn.execute(
                "UPDATE threads SET title = COALESCE(%s, title), metadata = COALESCE(%s, metadata), "
                "updated_at = now() WHERE resource_id = %s AND thread_id = %s "
                f"RETURNING {_THREAD_COLUMNS}",
                (
                    None if title is None else new_title,
                    None if metadata is None else new_metadata,
                    *key,
                ),
            )
            row = await cursor.fetchone()
            if row is None:
                raise ThreadNotFoundError(f"memory store {self.name}: no thread {label(thread_id)}")
            return _thread(row)

        return await self._write(update, f"updating thread {thread_id!r}", key)

    async def delete_thread(self, thread_id: str, resource_id: str) -> None:
        """Delete the resource's thread and (by the foreign key's cascade) its messages."""
        key = thread_key(self.name, thread_id, resource_id)

        async def delete(conn: Connection) -> None:
            await conn.execute("DELETE FROM threads WHERE resource_id = %s AND thread_id = %s", key)

        await self._write(delete, f"deleting thread {thread_id!r}", key)

    async def save_turn(
        self, thread_id: str, resource_id: str, messages: list[Message], *, fence: RunFence | None = None
    ) -> None:
        """Append (or replace by id) the turn's messages to the resource's thread, in one
        transaction, under the thread's lock; a durable run's (`fence`) only at its epoch, once per
        run (`hold_turn`, which locks the run's row first)."""
        key = thread_key(self.name, thread_id, resource_id)
        rows = encode_turn(self.name, thread_id, resource_id, messages, self._max_bytes)
        held = None if fence is None else check_fence(self.name, fence)

        async def save(conn: Connection) -> None:
            if held is not None:
                await hold_turn(self.name, _query(conn), held, "%s", " FOR UPDATE", key, [r[0] for r in rows])
            # Insert the resource's thread, or lock its existing row until commit: the per-thread
            # lock. Another resource's thread of this id is another row, untouched.
            await conn.execute(
                "INSERT INTO threads (resource_id, thread_id) VALUES (%s, %s) "
                "ON CONFLICT (resource_id, thread_id) DO UPDATE SET updated_at = now()",
                key,
            )
            # One statement (and one round trip) per message, not executemany: its pipeline leaves
            # the server waiting for the rest mid-protocol, where idle_in_transaction_session_timeout
            # is not armed, so a replica frozen there would hold this thread's and its durable run's
            # row locks for as long as it sleeps (a take-over of the run waiting on it).
            for row in rows:
                await conn.execute(
                    "INSERT INTO messages (resource_id, thread_id, id, role, body) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (resource_id, thread_id, id) "
                    "DO UPDATE SET role = EXCLUDED.role, body = EXCLUDED.body",
                    (*key, *row),
                )

        await self._write(save, f"saving a turn to thread {thread_id!r}", key)

    async def messages(
        self, thread_id: str, resource_id: str, *, last: int | None = None, include_signals: bool = True
    ) -> list[Message]:
        """The resource's thread's stored messages, oldest first: all, or the `last` N."""
        resource_id, thread_id = thread_key(self.name, thread_id, resource_id)
        sql, args = messages_query(self.name, thread_id, resource_id, last, include_signals, "%s")
        rows = await self._read(sql, args, f"reading the messages of thread {thread_id!r}")
        return [decode(row[0]) for row in rows]

    async def save_suspended(self, run: SuspendedRun, *, fence: RunFence | None = None) -> None:
        """Save the run (replacing one of its id) as `SUSPENDED` (a durable run's: at its epoch)."""
        row = encode_suspended(self.name, run, self._max_snapshot_bytes)
        held = None if fence is None else check_fence(self.name, fence)

        async def save(conn: Connection) -> None:
            if held is not None:
                await hold_fence(self.name, _query(conn), held, "%s", " FOR UPDATE", "suspending")
            await conn.execute(save_suspended_sql("%s", "now()"), row)

        await self._write(save, f"saving suspended run {row[0]!r}")

    async def claim_suspended(
        self, run_id: str, tool_call_id: str, *, resource_id: str | None = None
    ) -> SuspendedRun:
        """Mark the run `RESUMING` and return it, holding its row lock from the read to the commit."""
        run_id = check_id(self.name, "run", run_id)
        tool_call_id = check_id(self.name, "tool call", tool_call_id)

        async def claim(conn: Connection) -> SuspendedRun:
            cursor = await conn.execute(select_suspended_sql("%s") + " FOR UPDATE", (run_id,))
            run = claimed_run(self.name, run_id, tool_call_id, await cursor.fetchall(), iso, resource_id)
            await conn.execute(set_status_sql("%s", RESUMING), (run_id,))
            return run

        return await self._write(claim, f"claiming suspended run {run_id!r}")

    def _created_at(self, stored: Any) -> str:
        return iso(stored)

    def _time_arg(self, moment: datetime) -> Any:
        return moment

    def _lease_arg(self, seconds: float) -> Any:
        return seconds

    def _ago_arg(self, seconds: float) -> Any:
        return seconds

    def _moment(self, stored: Any) -> str:
        return iso(stored)

    async def _execute(self, sql: str, args: tuple[Any, ...], doing: str) -> None:
        """One statement in one write transaction."""

        async def execute(conn: Connection) -> None:
            await conn.execute(sql, args)

        await self._write(execute, doing)

    async def _transact(self, work: Callable[[Query], Awaitable[T]], doing: str) -> T:
        """`work`'s statements in one transaction on one pooled connection."""

        async def transaction(conn: Connection) -> T:
            return await work(_query(conn))

        return await self._write(transaction, doing)

    async def _migrate(self, conn: Connection) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        cursor = await conn.execute("SELECT version FROM schema_version")
        applied = {row[0] for row in await cursor.fetchall()}
        known = migrations("postgres")
        if applied and max(applied) > len(known):
            log.warning(
                "memory store %s: schema version %d is newer than this build's", self.name, max(applied)
            )
        for migration in known:
            if migration.version in applied:
                continue
            await conn.execute(migration.sql.encode())  # several statements, no parameters
            await conn.execute(
                "INSERT INTO schema_version (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            log.info(
                "memory store %s: applied migration %04d_%s", self.name, migration.version, migration.name
            )

    async def _write(
        self,
        work: Callable[[Connection], Awaitable[T]],
        doing: str,
        thread: tuple[str, str] | None = None,
    ) -> T:
        """`work` in one transaction on a pooled connection, committed or rolled back as a whole;
        with a `thread` key (``(resource_id, thread_id)``), after this process's earlier writes to it."""
        pool = self._connection_pool()
        lock = asyncio.Lock() if thread is None else self._thread_locks.setdefault(thread, asyncio.Lock())

        async def transaction() -> T:
            async with lock:
                with self._errors(doing):
                    async with pool.connection() as conn, conn.transaction():
                        return await work(conn)

        return await shielded(transaction())

    async def _read(self, sql: str, args: tuple[Any, ...], doing: str) -> list[Any]:
        pool = self._connection_pool()
        with self._errors(doing):
            async with pool.connection() as conn:
                cursor = await conn.execute(sql, args)
                return await cursor.fetchall()

    def _connection_pool(self) -> AsyncConnectionPool[Connection]:
        if self._pool is None:
            raise StoreUnavailableError(f"memory store {self.name} is not started (or closed)")
        return self._pool

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """psycopg's errors as the store's; connection trouble (and pool timeouts) is unavailability."""
        try:
            yield
        except MemoryStoreError:
            raise
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreUnavailableError(
                f"memory store {self.name} is unavailable: {doing}: {self._scrub(exc)}"
            ) from exc
        except psycopg.Error as exc:
            raise MemoryStoreError(f"memory store {self.name}: {doing}: {self._scrub(exc)}") from exc

    def _scrub(self, exc: Exception) -> str:
        """The driver's message, first line only, with the password masked should libpq ever echo it."""
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return text.replace(self._secret, "***") if self._secret else text


def _query(conn: Connection) -> Query:
    """Statements on `conn` (in its transaction), each returning its rows ([] when it has none)."""

    async def query(sql: str, args: tuple[Any, ...]) -> list[Any]:
        cursor = await conn.execute(sql, args)
        return await cursor.fetchall() if cursor.description else []

    return query


_CONNECT_FAILURES = (
    ("password authentication failed", "the server refused the password of the DSN's user"),
    ("role ", "the DSN's user does not exist on the server"),
    ("no pg_hba.conf entry", "the server's pg_hba.conf lets this user or host in with no method"),
    ("database ", "the DSN's database does not exist on the server"),
    ("Connection refused", "connection refused: nothing listens at that host and port"),
    ("No such file or directory", "no server socket at that path and port"),
    ("failed to resolve host", "the host name does not resolve"),
    ("timeout expired", "no answer from that host and port within the timeout"),
)


def connect_failure(first_line: str, text: str) -> str:
    """What a failed connection attempt says, in words naming the setting to fix (then the driver's
    first line, password masked)."""
    for marker, reason in _CONNECT_FAILURES:
        if marker in text and (marker not in ("role ", "database ") or "does not exist" in text):
            return f"{reason} ({first_line})"
    return first_line


def _describe(params: dict[str, Any]) -> str:
    host = str(params.get("host") or params.get("hostaddr") or "localhost")
    port = params.get("port") or 5432
    database = params.get("dbname") or params.get("user") or "postgres"
    return f"postgres:{host}:{port}/{database}"


def _thread(row: Any) -> Thread:
    thread_id, resource_id, title, metadata, created_at, updated_at = row
    return Thread(
        id=thread_id,
        resource_id=resource_id,
        title=title,
        metadata=decode(metadata),
        created_at=iso(created_at),
        updated_at=iso(updated_at),
    )
