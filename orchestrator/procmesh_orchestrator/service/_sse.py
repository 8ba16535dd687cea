"""Server-sent events: the heartbeat every stream of the HTTP API sends (runs and durable runs).

A proxy in front of the API cuts a connection idle for its timeout (often 60 s); a tool or a
model can be silent longer. A comment line (``: ping``) after every ``sse_heartbeat_seconds``
without an event keeps it open; SSE clients, @mastra/client-js included, skip comments.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

HEARTBEAT = b": ping\n\n"

T = TypeVar("T")


async def with_heartbeats(items: AsyncIterator[T], every: float) -> AsyncIterator[T | None]:
    """The items in order, with None after every `every` seconds without one (0: never).

    The pending read is waited on, never cancelled, so no item is lost or reordered; it is
    cancelled only when the consumer goes away. An error of `items` is raised where it happened.
    """
    if every <= 0:
        async for item in items:
            yield item
        return
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(items))
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                pending = None
                return
            pending = None
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await pending
