"""The MemoryStore contract, one suite for both backends (SQLite file, real PostgreSQL server)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from procmesh_orchestrator.errors import (
    InvalidMemoryInputError,
    MemoryStoreError,
    ThreadNotFoundError,
)
from procmesh_orchestrator.store import MemoryStore, Message, Thread
from tests.integration.memory.conftest import Backend

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def msg(message_id: str, role: str = "user", text: str = "") -> Message:
    text = text or f"text of {message_id}"
    return {
        "id": message_id,
        "role": role,
        "content": {"format": 2, "parts": [{"type": "text", "text": text}], "metadata": {}},
        "createdAt": "2026-01-01T00:00:00.000Z",
    }


def ids(messages: list[Message]) -> list[str]:
    return [m["id"] for m in messages]


# --- threads -----------------------------------------------------------------------------------


async def test_create_and_get_a_thread(store: MemoryStore) -> None:
    created = await store.create_thread(Thread("t1", "alice", title="Trip", metadata={"k": [1, "v"]}))
    assert (created.id, created.resource_id, created.title, created.metadata) == (
        "t1",
        "alice",
        "Trip",
        {"k": [1, "v"]},
    )
    assert ISO.match(created.created_at)
    assert ISO.match(created.updated_at)
    assert await store.get_thread("t1", "alice") == created
    assert await store.get_thread("nope", "alice") is None


async def test_creating_an_existing_thread_returns_it_as_stored(store: MemoryStore) -> None:
    first = await store.create_thread(Thread("t1", "alice", title="first"))
    again = await store.create_thread(Thread("t1", "alice", title="second"))
    assert again == first


async def test_thread_ids_are_scoped_by_resource(store: MemoryStore) -> None:
    # whichever resource uses an id first, the other gets its own thread of that id
    alice = await store.create_thread(Thread("t1", "alice", title="alice's"))
    mallory = await store.create_thread(Thread("t1", "mallory", title="mallory's"))
    assert (mallory.id, mallory.resource_id, mallory.title) == ("t1", "mallory", "mallory's")
    assert await store.get_thread("t1", "alice") == alice
    assert await store.get_thread("t1", "mallory") == mallory
    assert await store.get_thread("t1", "nobody") is None
    await store.save_turn("t2", "mallory", [msg("squat")])  # first on t2: no claim on alice's t2
    await store.save_turn("t2", "alice", [msg("u1")])
    await store.save_turn("t1", "alice", [msg("u1"), msg("a1", "assistant")])
    await store.save_turn("t1", "mallory", [msg("u1", text="evil"), msg("m2")])  # same message id
    assert ids(await store.messages("t1", "alice")) == ["u1", "a1"]
    assert (await store.messages("t1", "alice"))[0]["content"]["parts"][0]["text"] == "text of u1"
    assert ids(await store.messages("t1", "mallory")) == ["u1", "m2"]
    assert ids(await store.messages("t2", "alice")) == ["u1"]
    assert ids(await store.messages("t2", "mallory")) == ["squat"]
    assert await store.messages("t1", "nobody") == []
    assert ids(await store.messages("t1", "alice", last=1, include_signals=False)) == ["a1"]


async def test_another_resource_updates_and_deletes_only_its_own_thread(store: MemoryStore) -> None:
    await store.save_turn("t1", "alice", [msg("u1")])
    with pytest.raises(ThreadNotFoundError, match="no thread 't1'"):
        await store.update_thread("t1", "mallory", title="mine now")
    await store.delete_thread("t1", "mallory")  # no such thread of mallory's: nothing happens
    thread = await store.get_thread("t1", "alice")
    assert thread is not None
    assert thread.title == ""
    assert ids(await store.messages("t1", "alice")) == ["u1"]
    await store.save_turn("t1", "mallory", [msg("m1")])
    await store.delete_thread("t1", "mallory")
    assert ids(await store.messages("t1", "alice")) == ["u1"]
    assert await store.get_thread("t1", "mallory") is None
    assert [t.id for t in await store.list_threads("alice")] == ["t1"]
    assert await store.list_threads("mallory") == []


async def test_list_threads_by_resource_most_recently_updated_first(store: MemoryStore) -> None:
    for name in ("a", "b", "c"):
        await store.create_thread(Thread(name, "alice"))
    await store.create_thread(Thread("other", "bob"))
    assert [t.id for t in await store.list_threads("alice")] == ["c", "b", "a"]
    await store.save_turn("a", "alice", [msg("m1")])  # a save counts as an update
    assert [t.id for t in await store.list_threads("alice")] == ["a", "c", "b"]
    assert [t.id for t in await store.list_threads("alice", limit=2)] == ["a", "c"]
    assert [t.id for t in await store.list_threads("alice", limit=2, offset=2)] == ["b"]
    assert [t.id for t in await store.list_threads("bob")] == ["other"]
    assert await store.list_threads("nobody") == []


async def test_list_threads_in_either_order_and_count_them(store: MemoryStore) -> None:
    for name in ("a", "b", "c"):
        await store.create_thread(Thread(name, "alice"))
    await store.create_thread(Thread("other", "bob"))
    await store.save_turn("a", "alice", [msg("m1")])  # updated last, created first

    async def listed(**order: Any) -> list[str]:
        return [t.id for t in await store.list_threads("alice", **order)]

    assert await listed(order_by="created_at") == ["c", "b", "a"]
    assert await listed(order_by="created_at", descending=False) == ["a", "b", "c"]
    assert await listed(order_by="updated_at", descending=False) == ["b", "c", "a"]
    assert await listed(order_by="created_at", descending=False, limit=1, offset=1) == ["b"]
    assert [await store.count_threads(r) for r in ("alice", "bob", "nobody")] == [3, 1, 0]
    with pytest.raises(InvalidMemoryInputError, match="order_by"):
        await store.list_threads("alice", order_by="title; DROP TABLE threads")  # type: ignore[arg-type]
    with pytest.raises(InvalidMemoryInputError, match="resource"):
        await store.count_threads("")


async def test_update_thread_changes_only_what_is_given(store: MemoryStore) -> None:
    created = await store.create_thread(Thread("t1", "alice", title="old", metadata={"a": 1}))
    titled = await store.update_thread("t1", "alice", title="new")
    assert (titled.title, titled.metadata) == ("new", {"a": 1})
    assert titled.created_at == created.created_at
    assert titled.updated_at >= created.updated_at
    tagged = await store.update_thread("t1", "alice", metadata={"b": 2})
    assert (tagged.title, tagged.metadata) == ("new", {"b": 2})
    assert await store.get_thread("t1", "alice") == tagged


async def test_updating_a_missing_thread_is_not_found(store: MemoryStore) -> None:
    with pytest.raises(ThreadNotFoundError, match="no thread 'ghost'"):
        await store.update_thread("ghost", "alice", title="x")


async def test_delete_thread_takes_its_messages(store: MemoryStore) -> None:
    await store.save_turn("t1", "alice", [msg("m1"), msg("m2", "assistant")])
    await store.save_turn("t2", "alice", [msg("m1")])
    await store.delete_thread("t1", "alice")
    assert await store.get_thread("t1", "alice") is None
    assert await store.messages("t1", "alice") == []
    assert ids(await store.messages("t2", "alice")) == ["m1"]  # the other thread's same id is untouched
    await store.delete_thread("t1", "alice")  # deleting again is no error
    await store.save_turn("t1", "alice", [msg("m9")])  # the id is free again
    assert ids(await store.messages("t1", "alice")) == ["m9"]


# --- turns ---------------------------------------------------------------------------------------


async def test_save_turn_creates_the_thread_and_keeps_order(store: MemoryStore) -> None:
    await store.save_turn("t1", "alice", [msg("u1"), msg("a1", "assistant")])
    await store.save_turn("t1", "alice", [msg("u2"), msg("a2", "assistant")])
    thread = await store.get_thread("t1", "alice")
    assert thread is not None
    assert thread.resource_id == "alice"
    stored = await store.messages("t1", "alice")
    assert ids(stored) == ["u1", "a1", "u2", "a2"]
    assert stored[0] == {**msg("u1"), "threadId": "t1", "resourceId": "alice"}


async def test_save_turn_of_another_resource_writes_only_its_own_thread(store: MemoryStore) -> None:
    await store.save_turn("t1", "alice", [msg("u1")])
    await store.save_turn("t1", "mallory", [msg("evil")])
    assert ids(await store.messages("t1", "alice")) == ["u1"]
    assert ids(await store.messages("t1", "mallory")) == ["evil"]
    stored = (await store.messages("t1", "mallory"))[0]
    assert (stored["threadId"], stored["resourceId"]) == ("t1", "mallory")


async def test_a_retried_save_never_duplicates(store: MemoryStore) -> None:
    turn = [msg("u1"), msg("a1", "assistant")]
    await store.save_turn("t1", "alice", turn)
    await store.save_turn("t1", "alice", [msg("u2")])
    await store.save_turn("t1", "alice", turn)  # the first turn again, e.g. after a lost reply
    assert ids(await store.messages("t1", "alice")) == ["u1", "a1", "u2"]


async def test_a_stored_id_is_replaced_in_place(store: MemoryStore) -> None:
    await store.save_turn("t1", "alice", [msg("u1"), msg("a1", "assistant", "draft")])
    await store.save_turn("t1", "alice", [msg("u2")])
    await store.save_turn("t1", "alice", [msg("a1", "assistant", "final")])
    stored = await store.messages("t1", "alice")
    assert ids(stored) == ["u1", "a1", "u2"]
    assert stored[1]["content"]["parts"][0]["text"] == "final"


async def test_an_empty_turn_only_creates_the_thread(store: MemoryStore) -> None:
    await store.save_turn("t1", "alice", [])
    assert await store.get_thread("t1", "alice") is not None
    assert await store.messages("t1", "alice") == []


async def test_content_round_trips_byte_for_byte(store: MemoryStore) -> None:
    # NUL, a lone surrogate, astral characters: what model output may contain; jsonb would refuse NUL.
    text = 'nul\x00 surrogate \ud800 emoji \U0001f600 quote"back\\slash\nnewline'
    message = {
        **msg("u1", text=text),
        "content": {
            "format": 2,
            "parts": [{"type": "text", "text": text}],
            "metadata": {"n": 1.5, "z": None},
        },
    }
    await store.save_turn("t1", "alice", [message])
    assert (await store.messages("t1", "alice"))[0] == {**message, "threadId": "t1", "resourceId": "alice"}


# --- recall windows ------------------------------------------------------------------------------


async def _history_with_signals(store: MemoryStore) -> None:
    await store.save_turn("t1", "alice", [msg("u1"), msg("s1", "signal"), msg("a1", "assistant")])
    await store.save_turn("t1", "alice", [msg("u2"), msg("a2", "assistant"), msg("s2", "signal")])


async def test_last_n_counts_signals_when_they_are_included(store: MemoryStore) -> None:
    await _history_with_signals(store)
    assert ids(await store.messages("t1", "alice")) == ["u1", "s1", "a1", "u2", "a2", "s2"]
    assert ids(await store.messages("t1", "alice", last=3)) == ["u2", "a2", "s2"]
    assert ids(await store.messages("t1", "alice", last=1)) == ["s2"]


async def test_default_recall_hides_signals_and_counts_without_them(store: MemoryStore) -> None:
    await _history_with_signals(store)
    assert ids(await store.messages("t1", "alice", include_signals=False)) == ["u1", "a1", "u2", "a2"]
    assert ids(await store.messages("t1", "alice", last=3, include_signals=False)) == ["a1", "u2", "a2"]


async def test_window_edges(store: MemoryStore) -> None:
    await _history_with_signals(store)
    assert await store.messages("t1", "alice", last=0) == []
    assert len(await store.messages("t1", "alice", last=1000)) == 6
    assert await store.messages("no-such-thread", "alice", last=5) == []


# --- malformed input -----------------------------------------------------------------------------

BAD_IDS: list[Any] = ["", "x" * 10_000, 42, None, b"bytes", "a\x00b", "line\nbreak", "\ud800"]


@pytest.mark.parametrize(
    "bad", BAD_IDS, ids=["empty", "huge", "int", "none", "bytes", "nul", "newline", "surrogate"]
)
async def test_malformed_ids_are_refused_clearly(store: MemoryStore, backend: Backend, bad: Any) -> None:
    calls = [
        store.get_thread(bad, "alice"),
        store.create_thread(Thread(bad, "alice")),
        store.create_thread(Thread("t1", bad)),
        store.update_thread(bad, "alice", title="x"),
        store.delete_thread(bad, "alice"),
        store.save_turn(bad, "alice", [msg("m1")]),
        store.save_turn("t1", bad, [msg("m1")]),
        store.save_turn("t1", "alice", [msg("ok"), {**msg("m1"), "id": bad}]),
        store.messages(bad, "alice"),
        store.list_threads(bad),
        store.get_thread("t1", bad),
        store.update_thread("t1", bad, title="x"),
        store.delete_thread("t1", bad),
        store.messages("t1", bad),
    ]
    for call in calls:
        with pytest.raises(InvalidMemoryInputError) as caught:
            await call
        text = str(caught.value)
        assert "memory store " + backend.name in text
        assert " id " in text
        assert len(text) < 300  # a huge id is cut short, not echoed
    assert await store.messages("t1", "alice") == []  # the turn with one bad id wrote nothing
    assert await store.get_thread("t1", "alice") is None


async def test_an_oversized_message_fails_the_whole_turn(backend: Backend) -> None:
    store = backend.open(max_message_bytes=10_000)
    await store.start()
    try:
        with pytest.raises(
            InvalidMemoryInputError, match=r"message 1 is \d+ bytes as JSON, more than the 10000"
        ):
            await store.save_turn("t1", "alice", [msg("u1"), msg("a1", "assistant", "x" * 20_000)])
        assert await store.messages("t1", "alice") == []
        await store.save_turn("t1", "alice", [msg("u1"), msg("a1", "assistant", "x" * 9_000)])
        assert ids(await store.messages("t1", "alice")) == ["u1", "a1"]
    finally:
        await store.close()


@pytest.mark.parametrize(
    "bad",
    [
        "not a message",
        {"role": "user"},
        {"id": "m1"},
        {"id": "m1", "role": ""},
        {"id": "m1", "role": "user", "content": {1, 2}},
        {"id": "m1", "role": "user", "content": float("nan")},
    ],
    ids=["str", "no-id", "no-role", "empty-role", "set", "nan"],
)
async def test_malformed_messages_are_refused(store: MemoryStore, bad: Any) -> None:
    with pytest.raises(InvalidMemoryInputError, match="thread 't1': message 1"):
        await store.save_turn("t1", "alice", [msg("u1"), bad])
    assert await store.get_thread("t1", "alice") is None


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda s: s.messages("t1", "alice", last=-1), "last must be an integer from 0"),
        (lambda s: s.messages("t1", "alice", last=True), "last must be an integer"),
        (lambda s: s.list_threads("alice", limit=0), "limit must be an integer from 1"),
        (lambda s: s.list_threads("alice", offset=-5), "offset must be an integer from 0"),
        (lambda s: s.save_turn("t1", "alice", "not a list"), "a turn is a list of messages"),
        (lambda s: s.create_thread(Thread("t1", "alice", title=7)), "title must be a string"),  # type: ignore[arg-type]
        (lambda s: s.update_thread("t1", "alice", metadata=["x"]), "metadata must be an object"),
    ],
)
async def test_malformed_arguments_are_refused(store: MemoryStore, call: Any, pattern: str) -> None:
    with pytest.raises(InvalidMemoryInputError, match=pattern):
        await call(store)


# --- concurrency, cancellation, lifecycle --------------------------------------------------------


async def test_concurrent_saves_in_one_process_keep_every_turn_whole(store: MemoryStore) -> None:
    async def turn(n: int) -> None:
        thread = f"t{n % 5}"
        await store.save_turn(
            thread, "alice", [msg(f"{n}-u"), msg(f"{n}-s", "signal"), msg(f"{n}-a", "assistant")]
        )

    await asyncio.gather(*(turn(n) for n in range(60)))
    total = 0
    for t in range(5):
        stored = ids(await store.messages(f"t{t}", "alice"))
        total += len(stored)
        for i in range(0, len(stored), 3):  # each turn's three messages stay together, in order
            n = stored[i].split("-")[0]
            assert stored[i : i + 3] == [f"{n}-u", f"{n}-s", f"{n}-a"]
    assert total == 180


async def test_concurrent_saves_to_one_thread_commit_in_call_order(store: MemoryStore) -> None:
    await asyncio.gather(
        *(store.save_turn("t1", "alice", [msg(f"{n}-u"), msg(f"{n}-a", "assistant")]) for n in range(30))
    )
    assert ids(await store.messages("t1", "alice")) == [
        f"{n}-{part}" for n in range(30) for part in ("u", "a")
    ]


async def test_concurrent_creates_of_one_thread_give_one_thread(store: MemoryStore) -> None:
    results = await asyncio.gather(
        *(store.create_thread(Thread("t1", "alice", title=f"#{i}")) for i in range(10)),
        return_exceptions=True,
    )
    threads = [r for r in results if isinstance(r, Thread)]
    assert len(threads) == 10
    assert len({t.created_at for t in threads}) == 1
    assert len(await store.list_threads("alice")) == 1


async def test_a_cancelled_save_is_whole_or_absent_and_the_store_goes_on(store: MemoryStore) -> None:
    for n in range(20):
        task = asyncio.ensure_future(
            store.save_turn("t1", "alice", [msg(f"{n}-u"), msg(f"{n}-a", "assistant")])
        )
        await asyncio.sleep(0.0005 * (n % 4))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await store.save_turn("t1", "alice", [msg("last")])
    stored = ids(await store.messages("t1", "alice"))
    assert stored[-1] == "last"
    pairs = stored[:-1]
    assert len(pairs) % 2 == 0
    assert all(pairs[i].replace("-u", "-a") == pairs[i + 1] for i in range(0, len(pairs), 2))


async def test_migrations_apply_once(backend: Backend) -> None:
    for _ in range(3):
        store = backend.open()
        await store.start()
        await store.save_turn("t1", "alice", [msg("u1")])
        await store.close()
    assert backend.schema_versions() == backend.latest_versions()


async def test_concurrent_start_ups_migrate_once(backend: Backend) -> None:
    stores = [backend.open() for _ in range(4)]
    await asyncio.gather(*(s.start() for s in stores))
    await asyncio.gather(*(s.save_turn("t1", "alice", [msg(f"m{i}")]) for i, s in enumerate(stores)))
    assert len(await stores[0].messages("t1", "alice")) == 4
    for s in stores:
        await s.close()
    assert backend.schema_versions() == backend.latest_versions()


async def test_two_stores_on_one_database_see_each_others_turns(backend: Backend) -> None:
    first, second = backend.open(), backend.open()
    await first.start()
    await second.start()
    try:
        await asyncio.gather(
            *(
                s.save_turn("t1", "alice", [msg(f"{i}-{j}-u"), msg(f"{i}-{j}-a", "assistant")])
                for j in range(10)
                for i, s in enumerate((first, second))
            )
        )
        assert len(await first.messages("t1", "alice")) == len(await second.messages("t1", "alice")) == 40
    finally:
        await first.close()
        await second.close()


async def test_a_closed_store_says_so(backend: Backend) -> None:
    store = backend.open()
    with pytest.raises(MemoryStoreError, match="is not started"):
        await store.messages("t1", "alice")
    await store.start()
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(MemoryStoreError, match=f"memory store {backend.name}.* is not started"):
        await store.save_turn("t1", "alice", [msg("u1")])
