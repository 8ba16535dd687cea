"""The judge verdict cache (`verdict_cache`): its key, the bounded in-process tier with its TTL
(a fake clock), calls in flight joined, and the Redis tier on a real redis-server shared by two
caches as by two replicas."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from procmesh_orchestrator.config.judge_cache import JudgeCacheConfig
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.service.grpc import verdict_cache
from procmesh_orchestrator.service.grpc.verdict_cache import MemoryVerdicts, VerdictCache
from tests.e2e.service.conftest import redis_server
from tests.e2e.service.durable_harness import RedisServer

__all__ = ["redis_server"]

SCHEMA = {"type": "object"}
QUESTION: dict[str, Any] = {
    "model": "judge",
    "processor": "guards/moderation",
    "messages": [("system", "moderate"), ("user", "hello")],
    "schema": SCHEMA,
    "settings": {"temperature": 0},
    "tenant": None,
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Counts:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def __call__(self, processor: str, result: str) -> None:
        self.seen.append(result)


def test_the_key_covers_every_part_of_the_question() -> None:
    base = verdict_cache.key(**QUESTION)
    assert verdict_cache.key(**QUESTION) == base
    changes = {
        "model": "other",
        "processor": "guards/pii-detector",
        "messages": [("system", "moderate strictly"), ("user", "hello")],
        "schema": {"type": "array"},
        "settings": {"temperature": 0, "maxOutputTokens": 5},
        "tenant": "acme",
    }
    keys = {verdict_cache.key(**{**QUESTION, name: value}) for name, value in changes.items()}
    assert base not in keys
    assert len(keys) == len(changes)


def test_memory_is_bounded_least_recently_used_first_and_expires() -> None:
    clock = Clock()
    memory = MemoryVerdicts(2, ttl=10, clock=clock)
    memory.put("a", b"A")
    memory.put("b", b"B")
    assert memory.get("a") == b"A"  # a is now the most recent
    memory.put("c", b"C")
    assert (memory.get("a"), memory.get("b"), memory.get("c")) == (b"A", None, b"C")
    clock.now = 9.9
    assert memory.get("c") == b"C"
    clock.now = 10.0
    assert memory.get("c") is None
    assert len(memory) == 1


async def test_a_stored_verdict_is_reused_until_its_ttl_passes() -> None:
    clock, counts, calls = Clock(), Counts(), []

    async def ask() -> bytes:
        calls.append(1)
        return b"verdict"

    cache = VerdictCache(JudgeCacheConfig(enabled=True, ttl_seconds=5), counts, clock=clock)
    assert await cache.through("k", "p", ask) == (b"verdict", "miss")
    assert await cache.through("k", "p", ask) == (b"verdict", "memory")
    clock.now = 5.0
    assert await cache.through("k", "p", ask) == (b"verdict", "miss")
    assert len(calls) == 2
    assert counts.seen == ["miss", "memory", "miss"]


async def test_the_same_question_in_flight_is_asked_once_and_a_failure_is_not_shared() -> None:
    counts, gate, calls = Counts(), asyncio.Event(), []

    async def ask() -> bytes:
        calls.append(1)
        await gate.wait()
        return b"verdict"

    cache = VerdictCache(JudgeCacheConfig(enabled=True), counts)
    first = asyncio.create_task(cache.through("k", "p", ask))
    await asyncio.sleep(0)
    second = asyncio.create_task(cache.through("k", "p", ask))
    await asyncio.sleep(0)
    gate.set()
    assert await first == (b"verdict", "miss")
    assert await second == (b"verdict", "joined")
    assert len(calls) == 1
    assert counts.seen == ["miss", "joined"]

    async def fail() -> bytes:
        await asyncio.sleep(0)
        raise RuntimeError("judge down")

    failing = asyncio.create_task(cache.through("f", "p", fail))
    await asyncio.sleep(0)
    joined = asyncio.create_task(cache.through("f", "p", ask))  # asks itself once the other failed
    with pytest.raises(RuntimeError):
        await failing
    assert await joined == (b"verdict", "miss")


async def test_redis_shares_verdicts_between_replicas_and_expires_them(redis_server: RedisServer) -> None:
    config = JudgeCacheConfig.model_validate(
        {"enabled": True, "ttlSeconds": 0.2, "redis": {"url": redis_server.url, "keyPrefix": "t1:"}}
    )
    one, two = Counts(), Counts()
    first, second = VerdictCache(config, one), VerdictCache(config, two)
    calls = []

    async def ask() -> bytes:
        calls.append(1)
        return b"verdict"

    try:
        assert await first.through("k", "p", ask) == (b"verdict", "miss")
        assert await second.through("k", "p", ask) == (b"verdict", "redis")
        assert two.seen == ["redis"]
        assert len(calls) == 1
        # Redis's own TTL (no wall-clock assert): a third replica finds it gone once it expired
        third = VerdictCache(config, Counts())
        try:
            for _ in range(200):
                if await third._redis.get("k") is None:  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.02)
            assert await third.through("k", "p", ask) == (b"verdict", "miss")
        finally:
            await third.close()
    finally:
        await first.close()
        await second.close()


async def test_a_redis_that_is_down_is_a_miss_never_a_failed_call(tmp_path: Any) -> None:
    config = JudgeCacheConfig.model_validate(
        {"enabled": True, "redis": {"url": f"unix://{tmp_path}/none.sock", "timeout": 0.2}}
    )
    cache = VerdictCache(config, Counts())

    async def ask() -> bytes:
        return b"verdict"

    try:
        assert await cache.through("k", "p", ask) == (b"verdict", "miss")
        assert await cache.through("k", "p", ask) == (b"verdict", "memory")  # the memory tier still serves
    finally:
        await cache.close()


def test_the_section_is_strict() -> None:
    with pytest.raises(ValueError, match="maxEntrys"):
        JudgeCacheConfig.model_validate({"maxEntrys": 5})
    with pytest.raises(ValueError, match="urlEnv"):
        JudgeCacheConfig.model_validate({"redis": {}})
    with pytest.raises(ConfigError, match="PM_NO_SUCH_VAR"):
        JudgeCacheConfig.model_validate({"redis": {"urlEnv": "PM_NO_SUCH_VAR"}}).redis.redis_url({})  # type: ignore[union-attr]


async def test_an_unset_cache_url_variable_refuses_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """At start-up, not at the first judge call: a replica that would run without the shared tier
    (every verdict paid again, unseen) is refused naming the variable."""
    from procmesh_orchestrator.app import App
    from procmesh_orchestrator.config.loading import parse_config

    monkeypatch.delenv("PM_VERDICTS_URL", raising=False)
    config = parse_config(
        {
            "judgeCache": {"enabled": True, "redis": {"urlEnv": "PM_VERDICTS_URL"}},
            "models": {"m": {"provider": "demo"}},
            "agents": {"a": {"model": "m", "errorProcessorDefaults": False}},
        }
    )
    with pytest.raises(ConfigError, match="PM_VERDICTS_URL is not set"):
        async with App(config):
            pass
