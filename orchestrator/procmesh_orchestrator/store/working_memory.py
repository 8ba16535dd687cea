"""Working memory: one Markdown or JSON text the model keeps about a resource or one thread.

The reference's two scopes: a resource's working memory is shared by every thread of the
resource (``scope: resource``, its default), a thread's belongs to that thread alone. Here both are
one row, keyed ``(resource_id, thread_id)`` with ``thread_id`` "" for the resource's. Every write
is a read-modify-write under the row's lock (`update_working_memory` takes the new text as a
function of the stored one), so two replicas updating one memory at the same moment both land: the
second computes its text from the first's (a schema-mode merge keeps both updates' fields).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

RESOURCE_SCOPE = ""
"""The ``thread_id`` of a resource-scoped working memory."""


@dataclass(frozen=True)
class WorkingMemory:
    """A stored working memory."""

    text: str
    version: int
    """1 at the first write, one more at every write since."""
    updated_at: str = ""
    """ISO 8601, UTC."""


class WorkingMemoryStore(Protocol):
    """Working memory of resources and threads."""

    async def get_working_memory(
        self, resource_id: str, thread_id: str = RESOURCE_SCOPE
    ) -> WorkingMemory | None:
        """The resource's (`thread_id` "") or the resource's thread's working memory, or None."""

    async def update_working_memory(
        self,
        resource_id: str,
        thread_id: str,
        change: Callable[[str | None], str | None],
    ) -> WorkingMemory | None:
        """Replace the working memory with ``change(stored text or None)``, in one transaction that
        holds the row's lock from the read to the write (a concurrent update waits, then changes
        what this one wrote). `change` returning None writes nothing (returns the stored one); it refuses an
        update by raising `InvalidMemoryInputError`, which rolls the transaction back."""
