"""Thread ids scoped by resource (issue 24, finding 3): the schema upgrade that brings them
(migration 0005) keeps every thread and message, on both backends.

The data before the upgrade is written as a build of schema version 4 wrote it (`save_unscoped`):
this build's store no longer writes that schema.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable

import psycopg

from procmesh_orchestrator.store import Message
from tests.integration.memory.conftest import Backend
from tests.integration.memory.test_store_contract import ids, msg

UNSCOPED = 4
"""The last schema version whose thread ids were global."""


def save_unscoped(
    backend: Backend, thread_id: str, resource_id: str, messages: list[Message], *, title: str = ""
) -> None:
    """Save a turn as the stores of schema version 4 did: one global thread id."""
    rows = [
        (thread_id, m["id"], m["role"], json.dumps({**m, "threadId": thread_id, "resourceId": resource_id}))
        for m in messages
    ]
    if backend.name == "sqlite":
        with sqlite3.connect(backend.location) as db:
            now = "2026-01-01T00:00:00.000000Z"
            db.execute(
                "INSERT INTO threads (id, resource_id, title, created_at, updated_at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET updated_at = excluded.updated_at",
                (thread_id, resource_id, title, now, now),
            )
            db.executemany(
                "INSERT INTO messages (thread_id, id, role, body) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (thread_id, id) DO UPDATE SET body = excluded.body",
                rows,
            )
        return
    with psycopg.connect(backend.location) as pg:
        pg.execute(
            "INSERT INTO threads (id, resource_id, title) VALUES (%s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET updated_at = now()",
            (thread_id, resource_id, title),
        )
        with pg.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO messages (thread_id, id, role, body) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (thread_id, id) DO UPDATE SET body = EXCLUDED.body",
                rows,
            )


def delete_unscoped(backend: Backend, thread_id: str) -> None:
    """Delete a thread and its messages as the stores of schema version 4 did."""
    if backend.name == "sqlite":
        with sqlite3.connect(backend.location) as db:
            db.execute("DELETE FROM messages WHERE thread_id = ?", (thread_id,))
            db.execute("DELETE FROM threads WHERE id = ?", (thread_id,))
        return
    with psycopg.connect(backend.location) as pg:
        pg.execute("DELETE FROM threads WHERE id = %s", (thread_id,))


async def test_a_database_of_unscoped_threads_upgrades_in_place(
    backend: Backend, schema_at: Callable[[int | None], None]
) -> None:
    schema_at(UNSCOPED)
    old = backend.open()
    await old.start()
    await old.close()
    save_unscoped(
        backend, "t1", "alice", [msg("u1"), msg("s1", "signal"), msg("a1", "assistant")], title="Trip"
    )
    save_unscoped(backend, "t2", "bob", [msg("u1", text="bob's"), msg("a1", "assistant")])
    save_unscoped(backend, "t1", "alice", [msg("u2")])  # seq 6
    save_unscoped(backend, "gone", "bob", [msg("x1"), msg("x2"), msg("x3")])  # seqs 7 to 9 ...
    delete_unscoped(backend, "gone")  # ... deleted: never reused for later messages
    assert backend.schema_versions() == list(range(1, UNSCOPED + 1))

    schema_at(None)
    new = backend.open()
    await new.start()
    try:
        assert backend.schema_versions() == backend.latest_versions()
        # every thread and message is there, in order, under its resource
        thread = await new.get_thread("t1", "alice")
        assert thread is not None
        assert (thread.id, thread.resource_id, thread.title) == ("t1", "alice", "Trip")
        stored = await new.messages("t1", "alice")
        assert ids(stored) == ["u1", "s1", "a1", "u2"]
        assert stored[0] == {**msg("u1"), "threadId": "t1", "resourceId": "alice"}
        assert ids(await new.messages("t1", "alice", last=2, include_signals=False)) == ["a1", "u2"]
        assert ids(await new.messages("t2", "bob")) == ["u1", "a1"]
        assert [t.id for t in await new.list_threads("bob")] == ["t2"]
        assert [t.id for t in await new.list_threads("alice")] == ["t1"]
        assert await new.get_thread("t1", "bob") is None
        assert await new.messages("t1", "bob") == []
        # the ids are scoped from now on: bob's t1 is a thread of his own
        await new.save_turn("t1", "bob", [msg("b1")])
        await new.save_turn("t1", "alice", [msg("u3"), msg("u1", text="edited")])  # u1 in place
        stored = await new.messages("t1", "alice")
        assert ids(stored) == ["u1", "s1", "a1", "u2", "u3"]
        assert stored[0]["content"]["parts"][0]["text"] == "edited"
        assert ids(await new.messages("t1", "bob")) == ["b1"]
        # the foreign key came along: deleting a thread takes its messages, and only its own
        await new.delete_thread("t1", "bob")
        assert await new.messages("t1", "bob") == []
        assert len(await new.messages("t1", "alice")) == 5
        assert (await new.get_thread("t2", "bob")) is not None
    finally:
        await new.close()
    assert _seq_of(backend, "bob", "t1") == []  # deleted above
    assert _seq_of(backend, "alice", "t1") == [1, 2, 3, 6, 11]  # u3 after the deleted 7 to 9 and b1's 10


def _seq_of(backend: Backend, resource_id: str, thread_id: str) -> list[int]:
    """The stored seqs of a thread's messages, in order."""
    if backend.name == "sqlite":
        with sqlite3.connect(backend.location) as db:
            sql = "SELECT seq FROM messages WHERE resource_id = ? AND thread_id = ? ORDER BY seq"
            return [row[0] for row in db.execute(sql, (resource_id, thread_id))]
    with psycopg.connect(backend.location) as pg:
        sql = "SELECT seq FROM messages WHERE resource_id = %s AND thread_id = %s ORDER BY seq"
        return [row[0] for row in pg.execute(sql, (resource_id, thread_id))]
