"""Working memory in both real stores: scopes, the read-modify-write, and concurrent updates from
two store objects on one database (two SQLite connections to one file; two PostgreSQL pools), as
two replicas make them: none is lost."""

from __future__ import annotations

import asyncio
import json

import pytest

from procmesh_orchestrator.errors import InvalidMemoryInputError
from procmesh_orchestrator.store import MemoryStore
from procmesh_orchestrator.store.working_memory import RESOURCE_SCOPE
from tests.integration.memory.conftest import Backend


async def test_a_resource_and_its_threads_each_have_their_own(store: MemoryStore) -> None:
    assert await store.get_working_memory("alice") is None
    first = await store.update_working_memory("alice", RESOURCE_SCOPE, lambda old: f"{old}|one")
    assert first is not None
    assert (first.text, first.version) == ("None|one", 1)
    assert first.updated_at.endswith("Z") or "+00:00" in first.updated_at
    second = await store.update_working_memory("alice", RESOURCE_SCOPE, lambda old: f"{old}|two")
    assert second is not None
    assert (second.text, second.version) == ("None|one|two", 2)
    await store.update_working_memory("alice", "t1", lambda old: "thread's")
    assert (await store.get_working_memory("alice", "t1")).text == "thread's"  # type: ignore[union-attr]
    assert (await store.get_working_memory("alice")).text == "None|one|two"  # type: ignore[union-attr]
    # another resource's memory of the same scope is another row
    assert await store.get_working_memory("bob") is None
    assert await store.get_working_memory("bob", "t1") is None


async def test_a_change_that_writes_nothing_leaves_no_memory(store: MemoryStore) -> None:
    assert await store.update_working_memory("alice", RESOURCE_SCOPE, lambda old: None) is None
    assert await store.get_working_memory("alice") is None
    await store.update_working_memory("alice", RESOURCE_SCOPE, lambda old: "kept")
    kept = await store.update_working_memory("alice", RESOURCE_SCOPE, lambda old: None)
    assert kept is not None
    assert (kept.text, kept.version) == ("kept", 1)


async def test_a_failed_change_rolls_back_and_too_large_a_text_is_refused(store: MemoryStore) -> None:
    def boom(old: str | None) -> str:
        raise InvalidMemoryInputError("not JSON")

    with pytest.raises(InvalidMemoryInputError, match="not JSON"):
        await store.update_working_memory("alice", RESOURCE_SCOPE, boom)
    assert await store.get_working_memory("alice") is None
    with pytest.raises(InvalidMemoryInputError, match="working memory must be text"):
        await store.update_working_memory("alice", RESOURCE_SCOPE, lambda old: "x" * 10_000_000)


async def test_two_replicas_merging_at_once_lose_no_update(backend: Backend) -> None:
    """Each replica adds 25 keys to one JSON working memory, all 50 updates in flight together:
    each update reads what the one before it wrote (the row's lock), so all 50 keys are there."""
    replicas = [backend.open(), backend.open()]
    for replica in replicas:
        await replica.start()
    try:

        def add(key: str):  # type: ignore[no-untyped-def]
            def change(old: str | None) -> str:
                data = json.loads(old) if old else {}
                return json.dumps({**data, key: True})

            return change

        await asyncio.gather(
            *(replicas[i % 2].update_working_memory("alice", RESOURCE_SCOPE, add(f"k{i}")) for i in range(50))
        )
        final = await replicas[0].get_working_memory("alice")
        assert final is not None
        assert sorted(json.loads(final.text)) == sorted(f"k{i}" for i in range(50))
        assert final.version == 50
    finally:
        for replica in replicas:
            await replica.close()
