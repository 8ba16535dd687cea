"""Framework processors: lane entries the orchestrator itself runs, in process (memory's).

They sit in the lanes like a user's processors, so the lane rules apply to them unchanged (an
abort before the output lane's tail skips the save; a per-call list replaces only the user's
part), but the run calls them directly instead of through its `HookCaller`: they act on the run
(its message list, its store) rather than answering over a wire.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from procmesh_orchestrator.run.hooks import HookArgs

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

R = TypeVar("R")


class FrameworkProcessor(ABC):
    """A processor the run calls in process; it implements exactly `hooks`."""

    key: str
    """Identity in the lanes (`hooks.dedupe`); never a ``sidecar/id`` a user can configure."""
    processor_id: str
    """The id it reports as (as the reference names its own processors)."""
    hooks: frozenset[str]

    def has(self, hook: str) -> bool:
        """Whether it implements `hook` (snake_case)."""
        return hook in self.hooks

    def expand(self, request_context: Mapping[str, Any]) -> tuple[FrameworkProcessor, ...]:
        """A framework processor is never conditional: it stands for itself."""
        return (self,)

    @abstractmethod
    async def run_hook(self, run: RunCore, args: HookArgs[R]) -> R | None:
        """Handle one hook call on `run`; None when there is nothing for the run to apply."""
