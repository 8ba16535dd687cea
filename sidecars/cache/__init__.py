"""Response-cache backends: in-memory (per sidecar process) and Redis (shared)."""

from sidecars.cache.base import ServerCache
from sidecars.cache.memory import InMemoryServerCache
from sidecars.cache.redis_cache import RedisServerCache

__all__ = ["InMemoryServerCache", "RedisServerCache", "ServerCache"]
