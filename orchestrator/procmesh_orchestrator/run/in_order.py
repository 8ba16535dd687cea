"""Work of one step run concurrently up to a bound, its results taken in the order it was added.

The tool calls of a model step go through here (`tool_calls.run_tools`): the tools' own work
overlaps, while results, chunks and processToolResult keep the order the model called them in.
With bound 1 a piece of work starts only when its result is asked for, exactly as if it ran
inline: nothing runs ahead of an earlier call's processToolResult, or of an abort the output
processors raise on an earlier call's chunks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class InOrder(Generic[T]):
    """Up to `bound` of the added works in flight; `result(key)` waits for that one's."""

    def __init__(self, bound: int) -> None:
        if bound < 1:
            raise ValueError(f"bound must be at least 1, not {bound}")
        self._bound = bound
        # FIFO: works start in the order they were added, so the earliest calls get the slots.
        self._gate = asyncio.Semaphore(bound)
        self._waiting: dict[int, Callable[[], Awaitable[T]]] = {}
        self._tasks: dict[int, asyncio.Task[T]] = {}

    def add(self, key: int, work: Callable[[], Awaitable[T]]) -> None:
        """Queue `work`; with a bound above 1 it starts as soon as a slot is free."""
        self._waiting[key] = work
        if self._bound > 1:
            self._start(key)

    async def result(self, key: int) -> T:
        """The work's result (or its exception), starting it now if it has not started."""
        return await self._start(key)

    async def aclose(self) -> None:
        """Cancel what has not finished (the step ended early) and wait until it has stopped."""
        self._waiting.clear()
        for task in self._tasks.values():
            task.cancel()
        # Gathered so a failure nobody asked for is retrieved, not logged as never retrieved.
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _start(self, key: int) -> asyncio.Task[T]:
        task = self._tasks.get(key)
        if task is None:
            task = self._tasks[key] = asyncio.create_task(self._gated(self._waiting.pop(key)))
        return task

    async def _gated(self, work: Callable[[], Awaitable[T]]) -> T:
        async with self._gate:
            return await work()
