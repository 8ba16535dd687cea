"""An in-process `MemoryStore` for the loop tests: the contract, in dicts (the real stores are
tested by tests/integration/memory/test_store_contract.py). Threads are keyed by
``(resource_id, thread_id)``: thread ids are scoped by resource."""

from __future__ import annotations

import copy
from typing import Any

from procmesh_orchestrator.errors import StoreUnavailableError, ThreadNotFoundError
from procmesh_orchestrator.store import Message, Thread

Key = tuple[str, str]
"""A thread's key: ``(resource_id, thread_id)``."""


class DictStore:
    """Threads and messages in dicts; `down` makes every call fail as a store that is unreachable."""

    def __init__(self) -> None:
        self.threads: dict[Key, Thread] = {}
        self.rows: dict[Key, list[Message]] = {}
        self.saves: list[tuple[str, str, list[Message]]] = []
        self.down = False

    def _up(self) -> None:
        if self.down:
            raise StoreUnavailableError("memory store dict://test is unreachable")

    async def start(self) -> None:
        self._up()

    async def close(self) -> None:
        pass

    async def get_thread(self, thread_id: str, resource_id: str) -> Thread | None:
        self._up()
        return self.threads.get((resource_id, thread_id))

    async def create_thread(self, thread: Thread) -> Thread:
        self._up()
        key = (thread.resource_id, thread.id)
        existing = self.threads.get(key)
        if existing is not None:
            return existing
        self.threads[key] = thread
        self.rows[key] = []
        return thread

    async def list_threads(
        self,
        resource_id: str,
        *,
        limit: int = 100,
        offset: int = 0,
        order_by: str = "updated_at",
        descending: bool = True,
    ) -> list[Thread]:
        self._up()
        own = [t for t in self.threads.values() if t.resource_id == resource_id]
        own.sort(key=lambda t: getattr(t, order_by), reverse=descending)
        return own[offset : offset + limit]

    async def count_threads(self, resource_id: str) -> int:
        self._up()
        return sum(1 for t in self.threads.values() if t.resource_id == resource_id)

    async def update_thread(
        self,
        thread_id: str,
        resource_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Thread:
        self._up()
        thread = self.threads.get((resource_id, thread_id))
        if thread is None:
            raise ThreadNotFoundError(thread_id)
        thread = Thread(
            thread.id,
            thread.resource_id,
            title if title is not None else thread.title,
            metadata if metadata is not None else thread.metadata,
        )
        self.threads[(resource_id, thread_id)] = thread
        return thread

    async def delete_thread(self, thread_id: str, resource_id: str) -> None:
        self._up()
        self.threads.pop((resource_id, thread_id), None)
        self.rows.pop((resource_id, thread_id), None)

    async def save_turn(
        self, thread_id: str, resource_id: str, messages: list[Message], *, fence: object = None
    ) -> None:
        assert fence is None, "this fake keeps no durable runs: a fenced save needs a real store"
        self._up()
        await self.create_thread(Thread(thread_id, resource_id))
        rows = self.rows[(resource_id, thread_id)]
        self.saves.append((thread_id, resource_id, copy.deepcopy(messages)))
        for msg in messages:
            msg = {**copy.deepcopy(msg), "threadId": thread_id, "resourceId": resource_id}
            at = next((i for i, m in enumerate(rows) if m["id"] == msg["id"]), None)
            if at is None:
                rows.append(msg)
            else:
                rows[at] = msg

    async def messages(
        self, thread_id: str, resource_id: str, *, last: int | None = None, include_signals: bool = True
    ) -> list[Message]:
        self._up()
        rows = [
            m for m in self.rows.get((resource_id, thread_id), []) if include_signals or m["role"] != "signal"
        ]
        if last is not None:
            rows = rows[-last:] if last else []
        return copy.deepcopy(rows)
