"""Threads and their messages: the store's first aggregate.

A thread is named by its resource AND its id: thread ids are scoped by resource, so two resources
using one thread id have two separate threads, and no resource can read, squat or block another's.
Every method that takes a thread id takes the caller's resource with it, and checks it in the same
statement (or transaction) that reads or writes, so there is no window between an ownership check
and the read it guards.

Messages are the run's MastraDBMessage dicts (``id``, ``role``, ``content: {format: 2, parts,
metadata}``, ``createdAt``); ``role: "signal"`` messages are the persisted signals, kept in raw
history and hidden from default recall.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from procmesh_orchestrator.store.runs import RunFence

if TYPE_CHECKING:
    from procmesh_orchestrator.store.recall import MessageEmbedding

Message = dict[str, Any]

ThreadOrder = Literal["created_at", "updated_at"]
"""What a thread listing orders by."""


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


class ThreadStore(Protocol):
    """Threads and their messages. Every write is one transaction and idempotent by id."""

    async def get_thread(self, thread_id: str, resource_id: str) -> Thread | None:
        """The resource's thread of this id, or None (another resource's is no concern of it)."""

    async def create_thread(self, thread: Thread) -> Thread:
        """Create the thread of `thread.resource_id` (returns it with its timestamps); one of that
        resource with this id already is returned as it is."""

    async def list_threads(
        self,
        resource_id: str,
        *,
        limit: int = 100,
        offset: int = 0,
        order_by: ThreadOrder = "updated_at",
        descending: bool = True,
    ) -> list[Thread]:
        """The resource's threads ordered by `order_by` (newest first unless not `descending`;
        threads of one time in the store's fixed tie order), `limit` of them from `offset`."""

    async def count_threads(self, resource_id: str) -> int:
        """How many threads the resource has."""

    async def update_thread(
        self,
        thread_id: str,
        resource_id: str,
        *,
        title: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Thread:
        """Change title and/or metadata; `ThreadNotFoundError` when the resource has no such thread."""

    async def delete_thread(self, thread_id: str, resource_id: str) -> None:
        """Delete the resource's thread and its messages (no error when it does not exist)."""

    async def save_turn(
        self,
        thread_id: str,
        resource_id: str,
        messages: list[Message],
        *,
        fence: RunFence | None = None,
        embeddings: Sequence[MessageEmbedding] = (),
    ) -> None:
        """Append one turn's messages to the resource's thread, in order, in ONE transaction: all of
        them or none, with the `embeddings` of those messages (semantic recall: `store.recall`).

        Creates the thread when the resource has none of this id (another resource's thread of
        the same id is another thread, untouched). A message id already stored in the thread
        replaces that message in place (so a retried save never duplicates). Sets each message's
        ``threadId``/``resourceId``.

        With a `fence` (a durable run's turn), the save is made only while the run is running at
        the fence's epoch, checked in the same transaction (`FencedWriteError`, nothing written),
        and it is the run's turn, idempotent by the run's id: the messages an earlier save of the
        run put in the thread (a save repeated after a take-over, with new message ids) are
        replaced, so the thread holds the run's turn once.
        """

    async def delete_messages(self, resource_id: str, message_ids: list[str]) -> int:
        """Delete the resource's messages of these ids, in whichever of its threads they are, in
        one transaction (another resource's are never touched); how many were deleted."""

    async def messages(
        self, thread_id: str, resource_id: str, *, last: int | None = None, include_signals: bool = True
    ) -> list[Message]:
        """The resource's thread's stored messages, oldest first ([] when it has no such thread):
        all, or the `last` N (counting stored messages, signals included when `include_signals`).
        One statement, filtered on the resource. Default recall for people and the UI passes
        ``include_signals=False``; the run's history load passes True."""
