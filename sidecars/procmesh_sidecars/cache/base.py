"""The interface `response-cache` uses: JSON values by key, with a TTL."""

from __future__ import annotations

from typing import Any, Protocol


class ServerCache(Protocol):
    """A key/value cache of JSON values (the reference's MastraServerCache: get and set)."""

    async def get(self, key: str) -> Any | None:
        """The value stored under `key`, or None (missing or expired)."""
        ...

    async def set(self, key: str, value: Any, ttl_ms: float | None = None) -> None:
        """Store `value` under `key`; it expires after `ttl_ms` (None or <= 0: the default / never)."""
        ...

    async def delete(self, key: str) -> None:
        """Remove `key`."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...
