"""Working memory in both stores: one read-modify-write transaction under the row's lock.

PostgreSQL: the row is inserted if missing (``ON CONFLICT DO NOTHING``: a concurrent insert of the
same key waits for the other's commit) and then read ``FOR UPDATE``, so the read and the write of
one update hold the row's lock between them and a second replica's update reads the first's text.
SQLite: the transaction is BEGIN IMMEDIATE, which holds the file's write lock from the read on.
"""

from __future__ import annotations

from collections.abc import Callable

from procmesh_orchestrator.errors import InvalidMemoryInputError
from procmesh_orchestrator.store._checks import check_id, label
from procmesh_orchestrator.store._sql import Query, StoreHooks
from procmesh_orchestrator.store.working_memory import RESOURCE_SCOPE, WorkingMemory

_PLACEHOLDER_VERSION = 0
"""The version of a row inserted only to be locked (no text yet): read as no working memory."""


def _key(store: str, resource_id: object, thread_id: object) -> tuple[str, str]:
    resource = check_id(store, "resource", resource_id)
    if thread_id == RESOURCE_SCOPE:
        return resource, RESOURCE_SCOPE
    return resource, check_id(store, "thread", thread_id)


class WorkingMemoryMethods(StoreHooks):
    """`WorkingMemoryStore` on both backends, given the placeholder and `_for_update`."""

    async def get_working_memory(
        self, resource_id: str, thread_id: str = RESOURCE_SCOPE
    ) -> WorkingMemory | None:
        """The stored working memory of the resource or its thread, or None."""
        key = _key(self.name, resource_id, thread_id)
        p = self.placeholder
        sql = (
            "SELECT body, version, updated_at FROM working_memory "
            f"WHERE resource_id = {p} AND thread_id = {p} AND version > {_PLACEHOLDER_VERSION}"
        )
        rows = await self._read(sql, key, f"reading the working memory of {self._scope_label(key)}")
        return self._working_memory(rows[0]) if rows else None

    async def update_working_memory(
        self,
        resource_id: str,
        thread_id: str,
        change: Callable[[str | None], str | None],
    ) -> WorkingMemory | None:
        """Write ``change(stored)`` under the row's lock (see the module's docstring)."""
        key = _key(self.name, resource_id, thread_id)
        p, stamp = self.placeholder, self._stamp
        reserve = (
            "INSERT INTO working_memory (resource_id, thread_id, body, version, updated_at) "
            f"VALUES ({p}, {p}, '', {_PLACEHOLDER_VERSION}, {stamp}) "
            "ON CONFLICT (resource_id, thread_id) DO NOTHING"
        )
        read = (
            "SELECT body, version, updated_at FROM working_memory "
            f"WHERE resource_id = {p} AND thread_id = {p}{self._for_update}"
        )
        write = (
            f"UPDATE working_memory SET body = {p}, version = version + 1, updated_at = {stamp} "
            f"WHERE resource_id = {p} AND thread_id = {p} RETURNING body, version, updated_at"
        )
        doing = f"updating the working memory of {self._scope_label(key)}"

        async def update(query: Query) -> WorkingMemory | None:
            await query(reserve, (*key, *self._stamp_args()))
            body, version, updated_at = (await query(read, key))[0]
            stored = body if version > _PLACEHOLDER_VERSION else None
            text = change(stored)
            if text is None:
                return None if stored is None else self._working_memory((body, version, updated_at))
            if not isinstance(text, str) or len(text.encode()) > self._max_bytes:
                raise InvalidMemoryInputError(
                    f"memory store {self.name}: working memory must be text "
                    f"of at most {self._max_bytes} bytes"
                )
            return self._working_memory((await query(write, (text, *self._stamp_args(), *key)))[0])

        # The row's lock orders concurrent updates, in this process and across replicas.
        return await self._transact(update, doing)

    def _scope_label(self, key: tuple[str, str]) -> str:
        resource, thread = key
        return f"resource {label(resource)}" + (f" thread {label(thread)}" if thread else "")

    def _working_memory(self, row: tuple[str, int, object]) -> WorkingMemory:
        body, version, updated_at = row
        return WorkingMemory(text=body, version=int(version), updated_at=self._created_at(updated_at))
