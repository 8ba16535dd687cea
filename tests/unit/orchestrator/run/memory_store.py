"""An in-process `MemoryStore` for the loop tests: the contract, in dicts (the real stores are
tested by tests/integration/memory/test_store_contract.py)."""

from __future__ import annotations

import copy
from typing import Any

from procmesh_orchestrator.errors import StoreUnavailableError, ThreadNotFoundError, ThreadOwnershipError
from procmesh_orchestrator.memory.store import Message, Thread


class DictStore:
    """Threads and messages in dicts; `down` makes every call fail as a store that is unreachable."""

    def __init__(self) -> None:
        self.threads: dict[str, Thread] = {}
        self.rows: dict[str, list[Message]] = {}
        self.saves: list[tuple[str, str, list[Message]]] = []
        self.down = False

    def _up(self) -> None:
        if self.down:
            raise StoreUnavailableError("memory store dict://test is unreachable")

    async def start(self) -> None:
        self._up()

    async def close(self) -> None:
        pass

    async def get_thread(self, thread_id: str) -> Thread | None:
        self._up()
        return self.threads.get(thread_id)

    async def create_thread(self, thread: Thread) -> Thread:
        self._up()
        existing = self.threads.get(thread.id)
        if existing is not None:
            if existing.resource_id != thread.resource_id:
                raise ThreadOwnershipError(f"thread {thread.id!r} belongs to another resource")
            return existing
        self.threads[thread.id] = thread
        self.rows[thread.id] = []
        return thread

    async def list_threads(self, resource_id: str, *, limit: int = 100, offset: int = 0) -> list[Thread]:
        self._up()
        own = [t for t in self.threads.values() if t.resource_id == resource_id]
        return own[offset : offset + limit]

    async def update_thread(
        self, thread_id: str, *, title: str | None = None, metadata: dict[str, Any] | None = None
    ) -> Thread:
        self._up()
        thread = self.threads.get(thread_id)
        if thread is None:
            raise ThreadNotFoundError(thread_id)
        thread = Thread(
            thread.id,
            thread.resource_id,
            title if title is not None else thread.title,
            metadata if metadata is not None else thread.metadata,
        )
        self.threads[thread_id] = thread
        return thread

    async def delete_thread(self, thread_id: str) -> None:
        self._up()
        self.threads.pop(thread_id, None)
        self.rows.pop(thread_id, None)

    async def save_turn(self, thread_id: str, resource_id: str, messages: list[Message]) -> None:
        self._up()
        await self.create_thread(Thread(thread_id, resource_id))
        rows = self.rows[thread_id]
        self.saves.append((thread_id, resource_id, copy.deepcopy(messages)))
        for msg in messages:
            msg = {**copy.deepcopy(msg), "threadId": thread_id, "resourceId": resource_id}
            at = next((i for i, m in enumerate(rows) if m["id"] == msg["id"]), None)
            if at is None:
                rows.append(msg)
            else:
                rows[at] = msg

    async def messages(
        self, thread_id: str, *, last: int | None = None, include_signals: bool = True
    ) -> list[Message]:
        self._up()
        rows = [m for m in self.rows.get(thread_id, []) if include_signals or m["role"] != "signal"]
        if last is not None:
            rows = rows[-last:] if last else []
        return copy.deepcopy(rows)
