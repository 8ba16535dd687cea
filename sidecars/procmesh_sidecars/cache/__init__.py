"""Response-cache backends: in-memory (per sidecar process) and Redis (shared)."""

from procmesh_sidecars.cache.base import ServerCache
from procmesh_sidecars.cache.memory import InMemoryServerCache
from procmesh_sidecars.cache.redis_cache import RedisServerCache

__all__ = ["InMemoryServerCache", "RedisServerCache", "ServerCache"]
