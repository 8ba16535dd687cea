"""The judge's verdict cache: a typed judge answer, asked once, reused by content.

A guard's judge call is a question: the judged text inside the guard's prompt (its instructions,
categories and every option that shapes the question), the answer's JSON schema, the judge model.
Its answer depends on nothing else, so the gateway keys it by a hash of exactly that (`key`):
history re-sent every turn, a retried step and another replica asking the same question get the
stored answer and no model call. What a guard does with the answer (its threshold, its strategy)
is applied by the guard on every call, so an option a request context sets either changes the
question (and the key) or is applied afresh: no decision of one run is reused by another. The key
also holds the caller's tenant (the resource its gateway key is bound to), so even the same
question asked with two tenants' keys is answered twice.

Only deterministic questions are cached: a schema and temperature 0 (what the built-in guards
ask). Answers live in this process (`MemoryVerdicts`: bounded LRU with a TTL) and, when
configured, in Redis (`RedisVerdicts`, shared by replicas, the same TTL). A Redis that fails or
is slow is a miss, logged: the cache saves calls, it never fails one. Identical questions in
flight at once make one call (`VerdictCache.through`). Each lookup is traced as
``procmesh.judge_cache <processor>`` under the gateway's span, its result an attribute.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from procmesh import tracing
from procmesh.v1 import model_pb2 as mpb
from procmesh_orchestrator.config.judge_cache import JudgeCacheConfig

log = logging.getLogger(__name__)

KEY_VERSION = "1"
"""Part of every key: a change to what a key covers starts a new key space."""

Clock = Callable[[], float]


def key(
    *,
    model: str,
    processor: str,
    messages: list[tuple[str, str]],
    schema: dict[str, Any],
    settings: dict[str, Any],
    tenant: str | None,
) -> str:
    """The question's address: sha256 over its canonical JSON (key order fixed, no whitespace)."""
    question = {
        "v": KEY_VERSION,
        "model": model,
        "processor": processor,
        "messages": messages,
        "schema": schema,
        "settings": settings,
        "tenant": tenant or "",
    }
    return hashlib.sha256(_canonical(question).encode()).hexdigest()


_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
"""`json.dumps` with these options, its encoder made once (``dumps`` makes one per call)."""


class MemoryVerdicts:
    """Answers in this process: at most `max_entries` (least recently used out first), each for
    `ttl` seconds of `clock`."""

    def __init__(self, max_entries: int, ttl: float, clock: Clock = time.monotonic) -> None:
        self._max = max_entries
        self._ttl = ttl
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def get(self, key: str) -> bytes | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires, value = found
        if self._clock() >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: str, value: bytes) -> None:
        self._entries[key] = (self._clock() + self._ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class RedisVerdicts:
    """Answers in Redis under ``<prefix><key>``, expiring after `ttl` (Redis's own clock)."""

    def __init__(self, url: str, *, prefix: str, ttl: float, timeout: float) -> None:
        self._client = aioredis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._prefix = prefix
        self._ttl_ms = max(int(ttl * 1000), 1)

    async def get(self, key: str) -> bytes | None:
        try:
            value = await self._client.get(self._prefix + key)
        except (RedisError, OSError) as exc:
            log.warning("judge cache: Redis read failed, a miss: %s", type(exc).__name__)
            return None
        return value if isinstance(value, bytes) else None

    async def put(self, key: str, value: bytes) -> None:
        try:
            await self._client.set(self._prefix + key, value, px=self._ttl_ms)
        except (RedisError, OSError) as exc:
            log.warning("judge cache: Redis write failed, not shared: %s", type(exc).__name__)

    async def close(self) -> None:
        await self._client.aclose()


Count = Callable[[str, str], None]
"""Called with (processor, result) for each lookup: ``memory``, ``redis``, ``joined``, ``miss``."""


class VerdictCache:
    """The memory tier in front of the optional Redis tier, and the calls in flight by key."""

    def __init__(self, config: JudgeCacheConfig, count: Count, *, clock: Clock = time.monotonic) -> None:
        self.config = config
        self._count = count
        self._memory = MemoryVerdicts(config.max_entries, config.ttl_seconds, clock)
        redis = config.redis
        self._redis = (
            None
            if redis is None
            else RedisVerdicts(
                redis.redis_url(), prefix=redis.key_prefix, ttl=config.ttl_seconds, timeout=redis.timeout
            )
        )
        self._flying: dict[str, asyncio.Future[bytes]] = {}

    async def through(
        self, key: str, processor: str, call: Callable[[], Awaitable[bytes]]
    ) -> tuple[bytes, str]:
        """The stored answer, else the one a call in flight for `key` gives, else `call()`'s
        (then stored); and where it came from: ``memory``, ``joined``, ``redis`` (reused: no model
        call made for this caller) or ``miss``."""
        value = self._memory.get(key)
        if value is not None:
            self._count(processor, "memory")
            return value, "memory"
        flying = self._flying.get(key)
        if flying is not None:
            try:
                value = await asyncio.shield(flying)
            except asyncio.CancelledError:
                if cancelled_here():
                    raise  # this caller is cancelled; else the other one was: ask ourselves
            except Exception:  # the other caller's call failed: this one asks itself
                pass
            else:
                self._count(processor, "joined")
                return value, "joined"
        if self._redis is not None and (value := await self._redis.get(key)) is not None:
            self._memory.put(key, value)
            self._count(processor, "redis")
            return value, "redis"
        self._count(processor, "miss")
        return await self._call(key, call), "miss"

    async def _call(self, key: str, call: Callable[[], Awaitable[bytes]]) -> bytes:
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._flying[key] = future
        try:
            value = await call()
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a question nobody joined logs nothing
            raise
        except BaseException:
            future.cancel()  # the caller went away: whoever joined asks for itself
            raise
        finally:
            if self._flying.get(key) is future:
                del self._flying[key]
        future.set_result(value)
        self._memory.put(key, value)
        if self._redis is not None:
            await self._redis.put(key, value)
        return value

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.close()

    def address(
        self,
        request: mpb.ModelServiceGenerateRequest,
        schema: dict[str, Any] | None,
        settings: dict[str, Any],
        tenant: str | None,
    ) -> str | None:
        """`request`'s key when it is a deterministic question (a schema, temperature 0), else None."""
        if schema is None or settings.get("temperature") != 0:
            return None
        return key(
            model=request.model,
            processor=request.processor_id,
            messages=[(m.role, m.text) for m in request.messages],
            schema=schema,
            settings=settings,
            tenant=tenant,
        )

    def stored(self, address: str, processor: str) -> mpb.ModelServiceGenerateResponse | None:
        """The answer this process holds for `address` (counted ``memory``, no usage: this caller
        spent no tokens), without awaiting; None (not counted) when it holds none: `answer` then
        looks further."""
        value = self._memory.get(address)
        if value is None:
            return None
        self._count(processor, "memory")
        return _reused(value)

    async def answer(
        self,
        request: mpb.ModelServiceGenerateRequest,
        schema: dict[str, Any] | None,
        settings: dict[str, Any],
        tenant: str | None,
        processor: str,
        call: Callable[[], Awaitable[mpb.ModelServiceGenerateResponse]],
    ) -> tuple[mpb.ModelServiceGenerateResponse, bool]:
        """The gateway's answer to `request` through the cache when it is a deterministic question
        (a schema, temperature 0), else `call()`'s; and whether it was reused. A reused answer
        reports no usage: this caller spent no tokens."""
        address = self.address(request, schema, settings, tenant)
        if address is None:
            return await call(), False

        asked: list[mpb.ModelServiceGenerateResponse] = []

        async def ask() -> bytes:
            asked.append(await call())
            return asked[0].SerializeToString()

        with tracing.span(f"procmesh.judge_cache {processor}") as span:
            data, found = await self.through(address, processor, ask)
            span.set("procmesh.judge_cache.result", found)
        if found == "miss":  # the answer this call asked for, not decoded again
            return asked[0], False
        return _reused(data), True


def _reused(data: bytes) -> mpb.ModelServiceGenerateResponse:
    """A stored answer as a caller that reused it gets it: no usage."""
    response = mpb.ModelServiceGenerateResponse.FromString(data)
    response.ClearField("usage")
    return response


def cancelled_here() -> bool:
    """Whether the running task itself is being cancelled (not only a future it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
