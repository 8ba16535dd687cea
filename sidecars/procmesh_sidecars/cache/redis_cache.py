"""Redis cache (redis-py's asyncio client): JSON values, TTLs as Redis expirations (PX)."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis


class RedisServerCache:
    """A cache in Redis, shared by every sidecar process that points at the same server.

    Values are stored as JSON strings under ``prefix + key``; a TTL becomes the
    key's expiration (``SET ... PX``), so Redis drops expired entries itself.
    """

    def __init__(
        self, url: str | None = None, *, client: aioredis.Redis | None = None, prefix: str = ""
    ) -> None:
        if client is None:
            if not url:
                raise ValueError("RedisServerCache needs a url or a client")
            client = aioredis.Redis.from_url(url, decode_responses=True)
        self.client = client
        self.prefix = prefix

    async def get(self, key: str) -> Any | None:
        raw = await self.client.get(self.prefix + key)
        return None if raw is None else json.loads(raw)

    async def set(self, key: str, value: Any, ttl_ms: float | None = None) -> None:
        px = int(ttl_ms) if ttl_ms and ttl_ms > 0 else None
        await self.client.set(self.prefix + key, json.dumps(value, separators=(",", ":")), px=px)

    async def delete(self, key: str) -> None:
        await self.client.delete(self.prefix + key)

    async def aclose(self) -> None:
        await self.client.aclose()
