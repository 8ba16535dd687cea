"""Threads and messages in both stores: the checks, encodings and SQL they share.

A durable run's turn (`save_turn` with a fence) first holds the run's fence in the same
transaction (`_durable.hold_turn`), which locks the run's row: a claim of the run cannot come
between the check and the write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from procmesh_orchestrator.errors import InvalidMemoryInputError, ThreadNotFoundError
from procmesh_orchestrator.store._checks import MAX_PAGE, check_count, check_id, decode, encode_json, label
from procmesh_orchestrator.store._durable import check_fence, hold_turn
from procmesh_orchestrator.store._recall import embedding_statements
from procmesh_orchestrator.store._sql import Query, StoreHooks
from procmesh_orchestrator.store.recall import MessageEmbedding
from procmesh_orchestrator.store.runs import RunFence
from procmesh_orchestrator.store.threads import Message, Thread, ThreadOrder

MAX_TITLE_CHARS = 1024
SIGNAL_ROLE = "signal"
THREAD_COLUMNS = "thread_id, resource_id, title, metadata, created_at, updated_at"


def thread_key(store: str, thread_id: object, resource_id: object) -> tuple[str, str]:
    """A thread's key, ``(resource_id, thread_id)``: thread ids are scoped by resource. Both ids
    are checked (the thread's first)."""
    thread = check_id(store, "thread", thread_id)
    return check_id(store, "resource", resource_id), thread


def encode_turn(
    store: str, thread_id: str, resource_id: str, messages: object, max_bytes: int
) -> list[tuple[str, str, str]]:
    """The turn as ``(id, role, body)`` rows, every message checked before any is written."""
    if not isinstance(messages, list):
        raise InvalidMemoryInputError(
            f"memory store {store}: thread {label(thread_id)}: a turn is a list of messages, "
            f"not {type(messages).__name__}"
        )
    rows = []
    for index, message in enumerate(messages):
        where = f"thread {label(thread_id)}: message {index}"
        if not isinstance(message, dict):
            raise InvalidMemoryInputError(
                f"memory store {store}: {where} must be an object, not {type(message).__name__}"
            )
        message_id = check_id(store, f"{where}:", message.get("id"))
        role = message.get("role")
        if not isinstance(role, str) or not role or len(role) > 64:
            raise InvalidMemoryInputError(f"memory store {store}: {where} has no valid role: {label(role)}")
        stored: Message = {**message, "threadId": thread_id, "resourceId": resource_id}
        rows.append((message_id, role, encode_json(store, where, stored, max_bytes)))
    return rows


def check_thread_fields(store: str, title: object, metadata: object, max_bytes: int) -> tuple[str, str]:
    """A thread's title and metadata (as JSON text), checked."""
    if not isinstance(title, str) or len(title) > MAX_TITLE_CHARS:
        raise InvalidMemoryInputError(
            f"memory store {store}: a thread title must be a string of at most {MAX_TITLE_CHARS} characters"
        )
    if not isinstance(metadata, dict):
        raise InvalidMemoryInputError(
            f"memory store {store}: thread metadata must be an object, not {type(metadata).__name__}"
        )
    return title, encode_json(store, "thread metadata", metadata, max_bytes)


def messages_query(
    store: str, thread_id: str, resource_id: str, last: int | None, include_signals: bool, placeholder: str
) -> tuple[str, tuple[Any, ...]]:
    """The SQL and arguments that read a resource's thread's messages, oldest first (all, or the
    `last` N), in one statement filtered on the resource: another resource's thread of the same id
    is never read. The backends differ only in their placeholder (``?`` or ``%s``)."""
    p = placeholder
    where = f"resource_id = {p} AND thread_id = {p}"
    args: tuple[Any, ...] = (resource_id, thread_id)
    if not include_signals:
        where, args = f"{where} AND role <> {p}", (*args, SIGNAL_ROLE)
    if last is None:
        return f"SELECT body FROM messages WHERE {where} ORDER BY seq", args
    args = (*args, check_count(store, "last", last, low=0, high=2**62))
    sql = (
        f"SELECT body FROM (SELECT seq, body FROM messages WHERE {where} "
        f"ORDER BY seq DESC LIMIT {p}) AS window_ ORDER BY seq"
    )
    return sql, args


class ThreadMethods(StoreHooks):
    """The thread and message methods, the same SQL on both backends given the backend's
    placeholder, its write time (`_stamp`) and its tie-break in listings (`_thread_order`). Every
    write names its thread to `_transact`, which orders this process's writes to one thread."""

    async def get_thread(self, thread_id: str, resource_id: str) -> Thread | None:
        """The resource's thread of this id, or None."""
        key = thread_key(self.name, thread_id, resource_id)
        p = self.placeholder
        sql = f"SELECT {THREAD_COLUMNS} FROM threads WHERE resource_id = {p} AND thread_id = {p}"
        rows = await self._read(sql, key, f"reading thread {thread_id!r}")
        return self._thread(rows[0]) if rows else None

    async def create_thread(self, thread: Thread) -> Thread:
        """Create it; the same id of the same resource is returned as stored."""
        key = thread_key(self.name, thread.id, thread.resource_id)
        title, metadata = check_thread_fields(self.name, thread.title, thread.metadata, self._max_bytes)
        p, stamp = self.placeholder, self._stamp
        # One statement inserts the thread or, on an existing id of this resource, locks and
        # returns it unchanged (a no-op update): no window in which a concurrent delete leaves neither.
        sql = (
            "INSERT INTO threads (resource_id, thread_id, title, metadata, created_at, updated_at) "
            f"VALUES ({p}, {p}, {p}, {p}, {stamp}, {stamp}) ON CONFLICT (resource_id, thread_id) "
            f"DO UPDATE SET title = threads.title RETURNING {THREAD_COLUMNS}"
        )

        async def create(query: Query) -> Thread:
            now = self._stamp_args()
            return self._thread((await query(sql, (*key, title, metadata, *now, *now)))[0])

        return await self._transact(create, f"creating thread {key[1]!r}", key)

    async def list_threads(
        self,
        resource_id: str,
        *,
        limit: int = 100,
        offset: int = 0,
        order_by: ThreadOrder = "updated_at",
        descending: bool = True,
    ) -> list[Thread]:
        """The resource's threads ordered by `order_by`, `limit` of them from `offset`."""
        resource_id = check_id(self.name, "resource", resource_id)
        limit = check_count(self.name, "limit", limit, low=1, high=MAX_PAGE)
        offset = check_count(self.name, "offset", offset, low=0, high=2**62)
        if order_by not in ("created_at", "updated_at"):  # a column name goes into the SQL text
            raise InvalidMemoryInputError(
                f"memory store {self.name}: order_by must be created_at or updated_at, got {label(order_by)}"
            )
        p = self.placeholder
        sql = (
            f"SELECT {THREAD_COLUMNS} FROM threads WHERE resource_id = {p} "
            f"ORDER BY {order_by} {'DESC' if descending else 'ASC'}, {self._thread_order} "
            f"LIMIT {p} OFFSET {p}"
        )
        rows = await self._read(
            sql, (resource_id, limit, offset), f"listing the threads of resource {resource_id!r}"
        )
        return [self._thread(row) for row in rows]

    async def count_threads(self, resource_id: str) -> int:
        """How many threads the resource has."""
        resource_id = check_id(self.name, "resource", resource_id)
        sql = f"SELECT COUNT(*) FROM threads WHERE resource_id = {self.placeholder}"
        rows = await self._read(sql, (resource_id,), f"counting the threads of resource {resource_id!r}")
        return int(rows[0][0])

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
        p = self.placeholder
        sql = (
            f"UPDATE threads SET title = COALESCE({p}, title), metadata = COALESCE({p}, metadata), "
            f"updated_at = {self._stamp} WHERE resource_id = {p} AND thread_id = {p} "
            f"RETURNING {THREAD_COLUMNS}"
        )
        changes = (None if title is None else new_title, None if metadata is None else new_metadata)

        async def update(query: Query) -> Thread:
            rows = await query(sql, (*changes, *self._stamp_args(), *key))
            if not rows:
                raise ThreadNotFoundError(f"memory store {self.name}: no thread {label(thread_id)}")
            return self._thread(rows[0])

        return await self._transact(update, f"updating thread {thread_id!r}", key)

    async def delete_thread(self, thread_id: str, resource_id: str) -> None:
        """Delete the resource's thread, (by the foreign key's cascade) its messages, and its runs'
        decision records and recorded inputs."""
        key = thread_key(self.name, thread_id, resource_id)
        p = self.placeholder
        sql = f"DELETE FROM threads WHERE resource_id = {p} AND thread_id = {p}"
        decisions = f"DELETE FROM run_decisions WHERE resource_id = {p} AND thread_id = {p}"
        inputs = f"DELETE FROM run_inputs WHERE resource_id = {p} AND thread_id = {p}"

        async def delete(query: Query) -> None:
            await query(sql, key)
            await query(decisions, key)
            await query(inputs, key)

        await self._transact(delete, f"deleting thread {thread_id!r}", key)

    async def save_turn(
        self,
        thread_id: str,
        resource_id: str,
        messages: list[Message],
        *,
        fence: RunFence | None = None,
        embeddings: Sequence[MessageEmbedding] = (),
    ) -> None:
        """Append (or replace by id) the turn's messages to the resource's thread, in one
        transaction, under the thread's lock; a durable run's (`fence`) only at its epoch, once per
        run (`hold_turn`, which locks the run's row first). The messages' `embeddings` go in the
        same transaction."""
        key = thread_key(self.name, thread_id, resource_id)
        rows = encode_turn(self.name, thread_id, resource_id, messages, self._max_bytes)
        vectors = embedding_statements(self, key, embeddings)
        held = None if fence is None else check_fence(self.name, fence)
        p, stamp = self.placeholder, self._stamp
        # Insert the resource's thread, or touch its existing row, which locks it until commit (the
        # per-thread lock). Another resource's thread of this id is another row, untouched.
        touch = (
            f"INSERT INTO threads (resource_id, thread_id, created_at, updated_at) VALUES ({p}, {p}, "
            f"{stamp}, {stamp}) ON CONFLICT (resource_id, thread_id) "
            "DO UPDATE SET updated_at = excluded.updated_at"
        )
        # An id already in the thread keeps its place (its seq) and takes the new body.
        insert = (
            f"INSERT INTO messages (resource_id, thread_id, id, role, body) VALUES ({p}, {p}, {p}, {p}, "
            f"{p}) ON CONFLICT (resource_id, thread_id, id) "
            "DO UPDATE SET role = excluded.role, body = excluded.body"
        )

        async def save(query: Query) -> None:
            if held is not None:
                await hold_turn(self.name, query, held, p, self._for_update, key, [r[0] for r in rows])
            now = self._stamp_args()
            await query(touch, (*key, *now, *now))
            # One statement (and one round trip) per message, not a pipelined executemany: that
            # leaves PostgreSQL waiting for the rest mid-protocol, where
            # idle_in_transaction_session_timeout is not armed, so a replica frozen there would hold
            # this thread's and its durable run's row locks for as long as it sleeps.
            for row in rows:
                await query(insert, (*key, *row))
            for sql, args in vectors:
                await query(sql, args)

        await self._transact(save, f"saving a turn to thread {thread_id!r}", key)

    async def messages(
        self, thread_id: str, resource_id: str, *, last: int | None = None, include_signals: bool = True
    ) -> list[Message]:
        """The resource's thread's stored messages, oldest first: all, or the `last` N."""
        resource_id, thread_id = thread_key(self.name, thread_id, resource_id)
        sql, args = messages_query(self.name, thread_id, resource_id, last, include_signals, self.placeholder)
        rows = await self._read(sql, args, f"reading the messages of thread {thread_id!r}")
        return [decode(row[0]) for row in rows]

    async def delete_messages(self, resource_id: str, message_ids: list[str]) -> int:
        """Delete the resource's messages of these ids (the memory API's ``deleteMessages``)."""
        resource_id = check_id(self.name, "resource", resource_id)
        ids = sorted({check_id(self.name, "message", m) for m in message_ids})
        if not ids:
            return 0
        if len(ids) > MAX_PAGE:
            raise InvalidMemoryInputError(f"memory store {self.name}: at most {MAX_PAGE} messages at once")
        p = self.placeholder
        sql = (
            f"DELETE FROM messages WHERE resource_id = {p} AND id IN ({', '.join([p] * len(ids))}) "
            "RETURNING id"
        )
        rows = await self._transact(lambda query: query(sql, (resource_id, *ids)), "deleting messages")
        return len(rows)

    def _thread(self, row: Any) -> Thread:
        thread_id, resource_id, title, metadata, created_at, updated_at = row
        return Thread(
            id=thread_id,
            resource_id=resource_id,
            title=title,
            metadata=decode(metadata),
            created_at=self._created_at(created_at),
            updated_at=self._created_at(updated_at),
        )
