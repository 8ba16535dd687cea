"""Memory on PostgreSQL, for several orchestrator replicas sharing one database.

psycopg 3 async through an `AsyncConnectionPool` (each connection checked before use, so a restarted
server costs a reconnect, not a failed run). Every write is one transaction. Concurrent writers to
one thread, in any number of processes, are serialized by the thread row's lock: ``save_turn``
writes ``INSERT ... ON CONFLICT DO UPDATE`` on the thread first, which inserts it or locks the
existing row until commit, so the next writer's messages take their sequence numbers after
this turn's. A claim of a suspended run reads it ``FOR UPDATE``: concurrent claims queue on the row,
and each after the first finds it claimed. A claim of expired durable runs selects them ``FOR UPDATE
SKIP LOCKED`` and updates them in the same transaction: concurrent claims take disjoint runs, and
lease times are the server's ``now()``, whatever the replicas' clocks say. Migrations run under a
transaction-scoped advisory lock, so replicas that start at the same moment apply each migration once.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from procmesh_orchestrator.errors import MemoryStoreError, StoreUnavailableError
from procmesh_orchestrator.store._checks import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_SNAPSHOT_BYTES, iso
from procmesh_orchestrator.store._decisions import DecisionMethods
from procmesh_orchestrator.store._durable import DurableRunMethods
from procmesh_orchestrator.store._ledger import CostMethods
from procmesh_orchestrator.store._sql import Query, shielded
from procmesh_orchestrator.store._suspended import SuspendedRunMethods
from procmesh_orchestrator.store._threads import ThreadMethods
from procmesh_orchestrator.store._working_memory import WorkingMemoryMethods

T = TypeVar("T")
Connection = psycopg.AsyncConnection[tuple[Any, ...]]

MIGRATION_LOCK = 0x70726F636D657368  # "procmesh" in ASCII: the advisory lock key of start-up migrations


class PostgresMemoryStore(
    ThreadMethods,
    SuspendedRunMethods,
    DurableRunMethods,
    CostMethods,
    WorkingMemoryMethods,
    DecisionMethods,
):
    """Memory in a PostgreSQL database given by a libpq DSN (``postgresql://...`` or ``key=value``)."""

    placeholder = "%s"
    _stamp = "now()"  # the transaction's start: every row one transaction writes has one time
    _now = "now()"
    _lease = "now() + make_interval(secs => %s)"
    _ago = "now() - make_interval(secs => %s)"
    _for_update = " FOR UPDATE"  # concurrent admissions of one scope, or writes of one run, queue on its row
    _skip_locked = " FOR UPDATE SKIP LOCKED"  # concurrent claims take disjoint runs, nobody waits
    _thread_order = "thread_id"

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

    def _stamp_args(self) -> tuple[Any, ...]:
        return ()

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

    async def _transact(
        self, work: Callable[[Query], Awaitable[T]], doing: str, thread: tuple[str, str] | None = None
    ) -> T:
        """`work`'s statements in one transaction on one pooled connection (with a `thread`, after
        this process's earlier writes to it)."""
        return await self._write(lambda conn: work(_query(conn)), doing, thread)

    async def _migrate(self, conn: Connection) -> None:
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version "
            "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )

        async def run_script(script: str) -> None:
            await conn.execute(script.encode())  # several statements, no parameters

        await self._apply_migrations(_query(conn), "postgres", run_script)

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
