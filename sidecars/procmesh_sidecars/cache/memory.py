"""In-memory cache: per process, bounded (least recently used entries go first), with TTLs."""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from typing import Any


class InMemoryServerCache:
    """A bounded TTL cache in this process (the reference's InMemoryServerCache defaults)."""

    def __init__(self, max_size: int = 1000, ttl_ms: float = 300_000, clock: Any = time.monotonic) -> None:
        self.max_size = max_size
        self.ttl_ms = ttl_ms
        self._clock = clock
        self._items: OrderedDict[str, tuple[float | None, Any]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    async def get(self, key: str) -> Any | None:
        entry = self._items.get(key)
        if entry is None:
            return None
        expires, value = entry
        if expires is not None and self._clock() >= expires:
            del self._items[key]
            return None
        self._items.move_to_end(key)
        return copy.deepcopy(value)

    async def set(self, key: str, value: Any, ttl_ms: float | None = None) -> None:
        ttl = self.ttl_ms if ttl_ms is None else ttl_ms
        expires = self._clock() + ttl / 1000 if ttl and ttl > 0 else None
        self._items[key] = (expires, copy.deepcopy(value))
        self._items.move_to_end(key)
        while len(self._items) > self.max_size:
            self._items.popitem(last=False)

    async def delete(self, key: str) -> None:
        self._items.pop(key, None)

    async def clear(self) -> None:
        """Remove every entry."""
        self._items.clear()

    async def aclose(self) -> None:
        return None
