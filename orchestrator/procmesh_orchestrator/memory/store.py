"""The memory store contract: threads that belong to a resource, and their messages in order.

One contract, two backends: an embedded SQLite file (the default: nothing to install) and
PostgreSQL (several orchestrator replicas). `tests/integration/memory/test_store_contract.py` runs
the same suite against both. Messages are the run's MastraDBMessage dicts (``id``, ``role``,
``content: {format: 2, parts, metadata}``, ``createdAt``); ``role: "signal"`` messages are the
persisted signals, kept in raw history and hidden from default recall.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, Any]


@dataclass(frozen=True)
class Thread:
    """A conversation. It belongs to one resource (a user, an org) for its whole life."""

    id: str
    resource_id: str
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    created_at: str = ""
    """ISO 8601, UTC, set by the store."""
    updated_at: str = ""
    """ISO 8601, UTC: the last save or update."""


class MemoryStore(Protocol):
    """Where memory lives. Every write is one transaction and idempotent by id."""

    async def start(self) -> None:
        """Connect and apply the schema migrations not applied yet (versioned, at start-up)."""

    async def close(self) -> None:
        """Close connections."""

    async def get_thread(self, thread_id: str) -> Thread | None:
        """The thread, or None."""

    async def create_thread(self, thread: Thread) -> Thread:
        """Create it (returns it with its timestamps). An existing id of the same resource is returned
        as it is; of another resource, `ThreadOwnershipError`."""

    async def list_threads(self, resource_id: str, *, limit: int = 100, offset: int = 0) -> list[Thread]:
        """The resource's threads, most recently updated first."""

    async def update_thread(
        self, thread_id: str, *, title: str | None = None, metadata: dict[str, Any] | None = None
    ) -> Thread:
        """Change title and/or metadata; raises `ThreadNotFoundError` when there is no such thread."""

    async def delete_thread(self, thread_id: str) -> None:
        """Delete the thread and its messages (no error when it does not exist)."""

    async def save_turn(self, thread_id: str, resource_id: str, messages: list[Message]) -> None:
        """Append one turn's messages, in order, in ONE transaction: all of them or none.

        Creates the thread for `resource_id` when missing (`ThreadOwnershipError` when it belongs
        to another). A message id already stored in the thread replaces that message in place
        (so a retried save never duplicates). Sets each message's ``threadId``/``resourceId``.
        """

    async def messages(
        self, thread_id: str, *, last: int | None = None, include_signals: bool = True
    ) -> list[Message]:
        """Stored messages, oldest first: all, or the `last` N (counting stored messages, signals
        included when `include_signals`). Default recall for people and the UI passes
        ``include_signals=False``; the run's history load passes True."""
