"""The event log contract, run against both backends: in memory, and Redis Streams on a real
redis-server of this module's on a private unix socket (`redis_server`, the durable-run tests'
one; stopped and restarted by the outage tests)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.durable.events import (
    EventLog,
    EventLogConfig,
    MemoryEventLog,
    RedisEventLog,
    open_event_log,
)
from procmesh_orchestrator.errors import (
    ConfigError,
    EventLogError,
    EventLogFencedError,
    EventLogNotFoundError,
    EventLogUnavailableError,
)
from tests.e2e.service.conftest import redis_server
from tests.e2e.service.durable_harness import RedisServer

__all__ = ["redis_server"]  # a fixture, imported for this module

WAIT = 15.0
"""The bound on every wait for something to happen (never an assertion on how long it took)."""


@pytest_asyncio.fixture(params=["memory", "redis"])
async def log(request: pytest.FixtureRequest) -> AsyncIterator[EventLog]:
    """A started log; on Redis under a key prefix of its own, so tests never see each other's runs."""
    opened: EventLog
    if request.param == "memory":
        opened = MemoryEventLog()
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        opened = RedisEventLog(server.url, key_prefix=f"test:{uuid.uuid4().hex}:")
    await opened.start()
    yield opened
    await opened.close()


def chunk(i: int) -> dict[str, Any]:
    return {"type": "text-delta", "payload": {"id": "t1", "text": f"word {i} ü"}, "n": i}


async def fill(log: EventLog, run: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        assert await log.append(run, i, chunk(i)) is True


async def read_all(log: EventLog, run: str, offset: int = 0) -> list[tuple[int, dict[str, Any]]]:
    async with asyncio.timeout(WAIT):
        return [event async for event in log.read(run, offset, poll=0.1)]


async def test_appended_events_are_read_in_order(log: EventLog) -> None:
    assert await log.next_offset("r") == 0
    await fill(log, "r", 5)
    assert await log.next_offset("r") == 5
    await log.finish("r", 60)
    assert await log.next_offset("r") == 5  # the finished mark is no event
    assert await read_all(log, "r") == [(i, chunk(i)) for i in range(5)]
    assert await read_all(log, "r") == [(i, chunk(i)) for i in range(5)]  # reading consumes nothing


async def test_runs_are_separate_logs(log: EventLog) -> None:
    await fill(log, "a", 2)
    await fill(log, "b", 3)
    await log.finish("a", 60)
    await log.finish("b", 60)
    assert [i for i, _ in await read_all(log, "a")] == [0, 1]
    assert [i for i, _ in await read_all(log, "b")] == [0, 1, 2]


async def test_a_duplicate_offset_is_refused_and_changes_nothing(log: EventLog) -> None:
    await fill(log, "r", 3)
    assert await log.append("r", 1, {"other": True}) is False
    assert await log.append("r", 0, {"other": True}) is False
    assert await log.append("r", 2, {"other": True}) is False
    assert await log.next_offset("r") == 3
    assert await log.append("r", 3, chunk(3)) is True  # the writer goes on where the log is
    await log.finish("r", 60)
    assert await log.append("r", 3, {"late": True}) is False  # a duplicate stays False once finished
    assert await read_all(log, "r") == [(i, chunk(i)) for i in range(4)]


async def test_a_gap_is_an_error(log: EventLog) -> None:
    with pytest.raises(EventLogError, match=r"event 1 would leave a gap \(the log holds 0\)"):
        await log.append("r", 1, chunk(1))
    await fill(log, "r", 2)
    with pytest.raises(EventLogError, match=r"'r': event 5 would leave a gap \(the log holds 2\)"):
        await log.append("r", 5, chunk(5))
    assert await log.next_offset("r") == 2


async def test_bad_arguments_are_refused(log: EventLog) -> None:
    with pytest.raises(EventLogError, match="offset must be an int >= 0"):
        await log.append("r", -1, chunk(0))
    with pytest.raises(EventLogError, match="run id must be a non-empty string"):
        await log.append("", 0, chunk(0))
    with pytest.raises(EventLogError, match="not JSON"):
        await log.append("r", 0, {"x": object()})
    assert await log.next_offset("r") == 0


async def test_no_event_after_finish(log: EventLog) -> None:
    await fill(log, "r", 2)
    await log.finish("r", 60)
    await log.finish("r", 60)  # finishing twice is harmless
    with pytest.raises(EventLogError, match="'r' is finished: no event 2"):
        await log.append("r", 2, chunk(2))
    assert await read_all(log, "r") == [(0, chunk(0)), (1, chunk(1))]


async def test_a_run_finished_without_events_reads_empty(log: EventLog) -> None:
    await log.finish("empty", 60)
    assert await read_all(log, "empty") == []
    assert await log.next_offset("empty") == 0


async def test_reading_from_an_offset_gets_exactly_the_rest(log: EventLog) -> None:
    await fill(log, "r", 6)
    await log.finish("r", 60)
    assert await read_all(log, "r", 3) == [(i, chunk(i)) for i in range(3, 6)]
    assert await read_all(log, "r", 5) == [(5, chunk(5))]
    assert await read_all(log, "r", 6) == []
    assert await read_all(log, "r", 40) == []


async def test_a_live_reader_gets_later_events_then_stops_at_finish(log: EventLog) -> None:
    await fill(log, "r", 1)
    seen: asyncio.Queue[tuple[int, dict[str, Any]]] = asyncio.Queue()

    async def reader() -> int:
        count = 0
        async for event in log.read("r", poll=0.1):
            await seen.put(event)
            count += 1
        return count

    task = asyncio.create_task(reader())
    async with asyncio.timeout(WAIT):
        assert await seen.get() == (0, chunk(0))
        for i in (1, 2, 3):
            await log.append("r", i, chunk(i))
            assert await seen.get() == (i, chunk(i))  # delivered while the run is live
        await log.finish("r", 60)
        assert await task == 4
    assert seen.empty()


async def test_a_waiting_reader_cancels_promptly(log: EventLog) -> None:
    await fill(log, "r", 1)
    for attempt in range(20):  # cancelled at different points of its polling (a lost cancel would hang)
        started = asyncio.Event()

        async def reader(started: asyncio.Event) -> None:
            async for _ in log.read("r", poll=0.2):
                started.set()

        task = asyncio.create_task(reader(started))
        async with asyncio.timeout(WAIT):
            await started.wait()
        for _ in range(attempt % 5):
            await asyncio.sleep(0)
        task.cancel()
        done, _pending = await asyncio.wait([task], timeout=WAIT)
        assert done, "the cancelled reader is still running"
        assert task.cancelled()
    assert await log.append("r", 1, chunk(1)) is True  # the log is fine after cancelled readers


async def test_readers_that_reconnect_see_every_event_exactly_once(log: EventLog) -> None:
    """The issue's property at the log level: a client that drops and re-attaches at its last offset
    (three readers, each reconnecting at least three times) sees every event once and in order, even
    while a replica that took the run over re-publishes an interrupted step."""
    total = 30

    async def writer() -> None:
        for i in range(1, total):  # event 0 is in the log before the readers attach
            assert await log.append("r", i, chunk(i)) is True
            if i == 17:  # a takeover: the new owner re-publishes events 12..17, all refused
                for j in range(12, 18):
                    assert await log.append("r", j, {"replayed": j}) is False
            await asyncio.sleep(0)
        await log.finish("r", 60)

    async def reader(drop_every: int) -> tuple[list[int], int]:
        offsets: list[int] = []
        attaches = 0
        while True:
            attaches += 1
            got = 0
            async with aclosing(log.read("r", len(offsets), poll=0.1)) as events:
                async for offset, event in events:
                    assert event == chunk(offset)
                    offsets.append(offset)
                    got += 1
                    if got == drop_every:
                        break  # the client goes away mid-stream
                else:
                    return offsets, attaches

    await fill(log, "r", 1)  # the log exists once the run streamed its first chunk
    async with asyncio.timeout(WAIT):
        results = await asyncio.gather(writer(), reader(4), reader(7), reader(9))
    for offsets, attaches in results[1:]:
        assert offsets == list(range(total))
        assert attaches >= 4  # three reconnections at least


async def test_a_run_without_a_log_is_not_found_before_anything_is_yielded(log: EventLog) -> None:
    reader = log.read("never-ran").__aiter__()
    with pytest.raises(EventLogNotFoundError, match="'never-ran' has no log"):
        await anext(reader)
    with pytest.raises(EventLogNotFoundError):
        await read_all(log, "never-ran", 3)


async def test_a_finished_log_expires_after_its_retention(log: EventLog) -> None:
    await fill(log, "r", 2)
    await log.finish("r", 3600)
    assert len(await read_all(log, "r")) == 2
    await log.finish("r", 0.05)  # finishing again restarts the retention, here a short one
    async with asyncio.timeout(WAIT):
        while True:
            try:
                await read_all(log, "r")
            except EventLogNotFoundError:
                break
            await asyncio.sleep(0.02)
    assert await log.next_offset("r") == 0
    with pytest.raises(EventLogNotFoundError):
        await read_all(log, "r", 1)


async def test_closed_log_is_unavailable(log: EventLog) -> None:
    await log.close()
    with pytest.raises(EventLogUnavailableError, match="is not started"):
        await log.ping()
    with pytest.raises(EventLogUnavailableError, match="is not started"):
        await log.append("r", 0, chunk(0))
    with pytest.raises(EventLogUnavailableError, match="is not started"):
        await read_all(log, "r")
    await log.close()  # idempotent


# Redis only: the server goes away and comes back.


async def test_redis_going_away_is_unavailability_and_it_recovers(redis_server: RedisServer) -> None:
    log = RedisEventLog(redis_server.url, key_prefix=f"test:{uuid.uuid4().hex}:")
    await log.start()
    try:
        await fill(log, "r", 2)
        started = asyncio.Event()

        async def reader() -> None:
            async for _ in log.read("r", poll=0.1):
                started.set()

        live = asyncio.create_task(reader())
        async with asyncio.timeout(WAIT):
            await started.wait()
            redis_server.stop()
            with pytest.raises(EventLogUnavailableError, match=f"event log unix://{redis_server.socket}"):
                await live  # the live reader fails, naming the log
            with pytest.raises(EventLogUnavailableError, match="is unavailable: ping"):
                await log.ping()
            with pytest.raises(EventLogUnavailableError, match="appending event 2 of run 'r'"):
                await log.append("r", 2, chunk(2))
            with pytest.raises(EventLogUnavailableError, match="reading run 'r'"):
                await read_all(log, "r")
            with pytest.raises(EventLogUnavailableError):
                await log.next_offset("r")
            with pytest.raises(EventLogUnavailableError):
                await log.finish("r", 60)
    finally:
        if redis_server.proc is None:
            redis_server.start()  # its scripts are gone: Redis keeps none across a restart
    try:
        async with asyncio.timeout(WAIT):
            await log.ping()
            await fill(log, "again", 3)  # the append script is loaded again by itself
            await log.finish("again", 60)
            assert await read_all(log, "again") == [(i, chunk(i)) for i in range(3)]
    finally:
        await log.close()


async def test_redis_start_fails_when_the_server_is_down_naming_it_without_the_password() -> None:
    log = RedisEventLog("redis://:s3cret-pw@127.0.0.1:1/2", timeout=2)
    assert log.name == "redis://127.0.0.1:1/2"
    with pytest.raises(
        EventLogUnavailableError, match=r"event log redis://127.0.0.1:1/2 is unavailable"
    ) as info:
        await log.start()
    assert "s3cret" not in str(info.value)
    with pytest.raises(EventLogUnavailableError, match="is not started"):
        await log.ping()


def test_redis_names_and_urls() -> None:
    assert RedisEventLog("redis://localhost").name == "redis://localhost:6379/0"
    assert (
        RedisEventLog("rediss://u:pw@cache.example:6380/3?timeout=1").name == "rediss://cache.example:6380/3"
    )
    assert RedisEventLog("unix:///run/redis.sock?db=1&password=x").name == "unix:///run/redis.sock"
    with pytest.raises(EventLogError, match="scheme must be redis, rediss or unix"):
        RedisEventLog("http://localhost")


# open_event_log: plain values in, a log (not started) out.


def test_open_event_log_from_plain_values() -> None:
    assert isinstance(open_event_log({}), MemoryEventLog)
    assert isinstance(open_event_log(EventLogConfig(backend="memory")), MemoryEventLog)
    opened = open_event_log({"backend": "redis", "url": "redis://:pw@db.example:6390/1"})
    assert isinstance(opened, RedisEventLog)
    assert opened.name == "redis://db.example:6390/1"
    from_env = open_event_log(
        {"backend": "redis", "urlEnv": "PM_EVENTS_URL"}, environ={"PM_EVENTS_URL": "redis://h:1/0"}
    )
    assert from_env.name == "redis://h:1/0"
    config = EventLogConfig.model_validate({"backend": "redis", "url": "redis://h", "retentionSeconds": 60})
    assert config.retention_seconds == 60
    assert EventLogConfig().retention_seconds == 86400


def test_open_event_log_refuses_bad_values() -> None:
    with pytest.raises(ConfigError, match="eventLog: ttl: Extra inputs are not permitted"):
        open_event_log({"backend": "memory", "ttl": 3})
    with pytest.raises(ConfigError, match="the redis event log needs url or urlEnv"):
        open_event_log({"backend": "redis"})
    with pytest.raises(ConfigError, match="PM_EVENTS_UNSET is not set"):
        open_event_log({"backend": "redis", "urlEnv": "PM_EVENTS_UNSET"}, environ={})
    with pytest.raises(ConfigError, match="eventLog: backend: Input should be 'memory' or 'redis'"):
        open_event_log({"backend": "kafka"})
    with pytest.raises(ConfigError, match="eventLog: retentionSeconds: Input should be greater than 0"):
        open_event_log({"retentionSeconds": 0})


# --- the fence: a writer of an older epoch adds nothing --------------------------------------------


async def test_a_write_under_an_epoch_below_the_fence_is_refused_and_writes_nothing(log: EventLog) -> None:
    assert await log.append("r", 0, chunk(0), epoch=1) is True  # the creator's epoch sets the fence
    assert await log.append("r", 1, chunk(1), epoch=1) is True
    assert await log.fence("r", 2) == 2  # a claimant raises it before its claim commits
    with pytest.raises(
        EventLogFencedError, match="event 2 under epoch 1 refused: the run is at epoch 2"
    ) as no:
        await log.append("r", 2, chunk(2), epoch=1)
    assert (no.value.epoch, no.value.current) == (1, 2)
    with pytest.raises(EventLogFencedError):  # even an offset it holds: not a quiet duplicate
        await log.append("r", 0, chunk(0), epoch=1)
    with pytest.raises(EventLogFencedError, match="finishing the log under epoch 1 refused"):
        await log.finish("r", 60, epoch=1)
    assert await log.next_offset("r") == 2
    assert await log.append("r", 2, {"by": "b"}, epoch=2) is True  # the claimant writes on
    await log.finish("r", 60, epoch=2)
    assert [c for _, c in await read_all(log, "r")] == [chunk(0), chunk(1), {"by": "b"}]


async def test_the_fence_never_goes_down_and_a_higher_epoch_raises_it(log: EventLog) -> None:
    assert await log.fence("r", 3) == 3
    assert await log.fence("r", 2) == 3
    assert await log.append("r", 0, chunk(0), epoch=4) is True  # a later claim's writer
    assert await log.fence("r", 3) == 4
    with pytest.raises(EventLogFencedError):
        await log.append("r", 1, chunk(1), epoch=3)
    assert await log.append("r", 1, chunk(1)) is True  # an unfenced write (not a durable run's)
    for bad in (0, -1, True, "2"):
        with pytest.raises(EventLogError, match="an epoch must be an int >= 1"):
            await log.append("r", 2, chunk(2), epoch=bad)  # type: ignore[arg-type]
    assert await log.next_offset("r") == 2
