"""`ChunkBuffer`: a streamed run's chunks on their way to its reader, bounded, so a reader that
does not read pauses its own run instead of filling the process's memory.

The run puts chunks without waiting (`put_nowait`: a hook's few chunks, the step's start and end)
and, after each chunk of its output stream (the model's deltas), awaits `room` when `full`: while `limit`
chunks wait for the reader, the run stops pulling the model stream, and the model stream (a gRPC
or HTTP response) stops being read, so its sender is paused by the transport's own flow control.
The reader of a `RunStream` that stops reading for good calls `discard` (``RunStream.result``
does): what waits is dropped, nothing waits again, and the run goes on to its end unread.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

DEFAULT_LIMIT = 64
"""Chunks waiting for the reader before the run pauses: a few times what one model step sends in a
burst, so a reader that keeps up never makes the run wait; memory per stream is this many chunks
(plus the socket's buffers, which have their own bounds)."""


class ChunkBuffer:
    """A FIFO of chunks with a bound the producer waits on (`room`), not one that refuses a put."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"a chunk buffer holds at least 1 chunk, not {limit}")
        self._items: collections.deque[Any] = collections.deque()
        self._limit = limit
        self._readable = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._discarding = False
        self._unbounded = False

    def qsize(self) -> int:
        """Chunks waiting for the reader."""
        return len(self._items)

    def put_nowait(self, item: Any) -> None:
        """Add `item` for the reader (never waits: the run calls `room` where it may pause). Once
        discarding, only the last item put is kept, so a reader still iterating sees the end."""
        if self._discarding:
            self._items.clear()
        self._items.append(item)
        self._readable.set()
        if len(self._items) >= self._limit and not (self._discarding or self._unbounded):
            self._room.clear()

    async def get(self) -> Any:
        """The next item, waiting for one."""
        while not self._items:
            self._readable.clear()
            await self._readable.wait()
        item = self._items.popleft()
        if len(self._items) < self._limit:
            self._room.set()
        return item

    @property
    def full(self) -> bool:
        """Whether `room` would wait: `limit` chunks wait for the reader (and it reads)."""
        return not self._room.is_set()

    async def room(self) -> None:
        """Return once fewer than `limit` chunks wait (at once when they do, or when discarding)."""
        if self._room.is_set():
            return
        await self._room.wait()

    def unbound(self) -> None:
        """Someone awaits the run's end, and a reader may still iterate: keep every chunk (none
        dropped, the end included), and never make the producer wait again."""
        self._unbounded = True
        self._room.set()

    def discard(self) -> None:
        """The reader is gone: drop what waits, and never make the producer wait again."""
        self._discarding = True
        self._items.clear()
        self._room.set()
