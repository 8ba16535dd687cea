"""The event log on Redis Streams: one stream per run, shared by every replica that points at it.

Event `offset` is the entry ``{offset + 1}-0``: the ID is given to XADD explicitly, so the stream
itself orders the events and refuses one that is not above its top. The check that tells a duplicate
(False) from a gap (an error) and the XADD run together in one Lua script, so no other writer can
come between them (a replica taking a run over re-publishes the interrupted step). A finished log
ends with the entry ``18446744073709551615-0``, the largest ID Redis takes: a live XREAD wakes on
it, and no later event can be added. Retention is the stream key's expiration (PEXPIRE at finish).
Readers XREAD BLOCK from ``{offset}-0``; chunks are JSON in the field ``chunk``.

A run's fence (the highest epoch that wrote to its log, or that a claiming replica raised) is the
key ``<prefix><run id>:epoch``, read and raised by the same scripts that append and finish, so a
write under a lower epoch is refused atomically with the write it would have been; it expires with
the stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import EqualJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from procmesh_orchestrator.durable.events.log import check, check_epoch, encode, fenced
from procmesh_orchestrator.errors import EventLogError, EventLogNotFoundError, EventLogUnavailableError

FINISHED_ID = "18446744073709551615-0"
"""The last entry of a finished log (Redis's largest millisecond part)."""
_FIELD = "chunk"
_BATCH = 256
"""Entries per XREAD."""

# The fence check both writing scripts start with: KEYS[2] the run's fence, `mine` the writer's
# epoch ('' for an unfenced write). Refused: {-3, fence}; else the fence is raised to `mine`.
_FENCE_CHECK = """
local function fence_refuses(mine)
  if mine == '' then return nil end
  local held = tonumber(redis.call('GET', KEYS[2]) or '0')
  if tonumber(mine) < held then return {-3, held} end
  if tonumber(mine) > held then redis.call('SET', KEYS[2], mine) end
  return nil
end
"""

# KEYS[1] the run's stream, KEYS[2] its fence; ARGV: offset, entry id, chunk JSON, FINISHED_ID, epoch.
# Returns {1, n} appended, {0, n} already there, {-1, n} a gap, {-2, n} finished, {-3, fence}
# refused by the fence; n = events before.
_APPEND = (
    _FENCE_CHECK
    + """
local refused = fence_refuses(ARGV[5])
if refused then return refused end
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 2)
local n, finished = 0, false
for _, entry in ipairs(top) do
  if entry[1] == ARGV[4] then
    finished = true
  else
    n = tonumber(string.match(entry[1], '^(%d+)-'))
    break
  end
end
local offset = tonumber(ARGV[1])
if offset < n then return {0, n} end
if offset > n then return {-1, n} end
if finished then return {-2, n} end
redis.call('XADD', KEYS[1], ARGV[2], 'chunk', ARGV[3])
return {1, n}
"""
)

# KEYS[1] the run's stream, KEYS[2] its fence; ARGV: FINISHED_ID, retention in ms, epoch.
_FINISH = (
    _FENCE_CHECK
    + """
local refused = fence_refuses(ARGV[3])
if refused then return refused end
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #top == 0 or top[1][1] ~= ARGV[1] then
  redis.call('XADD', KEYS[1], ARGV[1], 'finished', '1')
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return {1, 0}
"""
)

# KEYS[1] the run's fence; ARGV: epoch. Raises the fence (never lowers it); returns it.
_RAISE = """
local held = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > held then
  redis.call('SET', KEYS[1], ARGV[1])
  return tonumber(ARGV[1])
end
return held
"""


class RedisEventLog:
    """Run logs in Redis (redis-py's asyncio client): what several replicas share.

    `url` is ``redis://[:password@]host:port/db``, ``rediss://...`` or ``unix:///path/redis.sock``;
    `timeout` bounds connecting and every command (a blocking read waits at most half of it per
    round). Connection trouble is an `EventLogUnavailableError` naming the log, never its password.
    """

    def __init__(self, url: str, *, key_prefix: str = "procmesh:run:", timeout: float = 5.0) -> None:
        self.name = _describe(url)
        """How errors name this log: scheme, host, port and database (or socket path)."""
        self._url = url
        self._secret = _password(url)
        self._prefix = key_prefix
        self._timeout = timeout
        self._client: aioredis.Redis | None = None

    async def __aenter__(self) -> RedisEventLog:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect and ping; `EventLogUnavailableError` when the server does not answer."""
        with self._errors("connecting"):
            client = aioredis.Redis.from_url(
                self._url,
                decode_responses=True,
                socket_timeout=self._timeout,
                socket_connect_timeout=self._timeout,
                # A blip is retried briefly; a server that is down is reported, not waited out.
                retry=Retry(EqualJitterBackoff(cap=0.5, base=0.05), retries=2),
            )
        try:
            with self._errors("connecting"):
                await client.ping()
        except BaseException:
            await client.aclose()
            raise
        self._client = client
        self._append = client.register_script(_APPEND)
        self._finish = client.register_script(_FINISH)
        self._raise = client.register_script(_RAISE)

    async def close(self) -> None:
        """Close the connections (idempotent)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def ping(self) -> None:
        """PING the server."""
        client = self._connected()
        with self._errors("ping"):
            await client.ping()

    async def append(
        self, run_id: str, offset: int, chunk: dict[str, Any], *, epoch: int | None = None
    ) -> bool:
        """Store `chunk` as event `offset`; False for an offset already in the log (see `EventLog`)."""
        data = encode(self.name, run_id, offset, chunk)
        check_epoch(self.name, run_id, epoch)
        self._connected()
        with self._errors(f"appending event {offset} of run {run_id!r}"):
            code, held = await self._append(
                keys=[self._key(run_id), self._fence_key(run_id)],
                args=[offset, f"{offset + 1}-0", data, FINISHED_ID, "" if epoch is None else epoch],
            )
        if code == -3:
            assert epoch is not None
            raise fenced(self.name, run_id, epoch, int(held), f"event {offset}")
        if code == 1:
            return True
        if code == 0:
            return False
        if code == -1:
            raise EventLogError(
                f"event log {self.name}: run {run_id!r}: event {offset} would leave a gap "
                f"(the log holds {held})"
            )
        raise EventLogError(f"event log {self.name}: run {run_id!r} is finished: no event {offset}")

    async def next_offset(self, run_id: str) -> int:
        """How many events the run's log holds (its last event's ID, past a finished mark)."""
        check(self.name, run_id, 0)
        client = self._connected()
        with self._errors(f"reading the offset of run {run_id!r}"):
            top = await client.xrevrange(self._key(run_id), count=2)
        for entry_id, _fields in top or ():
            if entry_id != FINISHED_ID:
                return _index(str(entry_id)) + 1
        return 0

    async def finish(self, run_id: str, retention_seconds: float, *, epoch: int | None = None) -> None:
        """Add the finished mark (once) and expire the stream (and its fence) `retention_seconds`
        from now."""
        check(self.name, run_id, 0)
        check_epoch(self.name, run_id, epoch)
        self._connected()
        with self._errors(f"finishing run {run_id!r}"):
            code, held = await self._finish(
                keys=[self._key(run_id), self._fence_key(run_id)],
                args=[FINISHED_ID, max(1, round(retention_seconds * 1000)), "" if epoch is None else epoch],
            )
        if code == -3:
            assert epoch is not None
            raise fenced(self.name, run_id, epoch, int(held), "finishing the log")

    async def fence(self, run_id: str, epoch: int) -> int:
        """Raise the run's fence to `epoch` (never lower); the fence now."""
        check(self.name, run_id, 0)
        check_epoch(self.name, run_id, epoch)
        self._connected()
        with self._errors(f"fencing run {run_id!r} at epoch {epoch}"):
            return int(await self._raise(keys=[self._fence_key(run_id)], args=[epoch]))

    async def read(
        self, run_id: str, offset: int = 0, *, poll: float = 1.0
    ) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """Every event from `offset` on, then the new ones, until the log is finished (see `EventLog`)."""
        check(self.name, run_id, offset)
        client = self._connected()
        key = self._key(run_id)
        block = max(1, round(min(poll, self._timeout / 2) * 1000))
        last = f"{offset}-0"
        waited = False  # the first read does not block: an empty answer then asks whether the log exists
        while True:
            with self._errors(f"reading run {run_id!r}"):
                reply = await client.xread({key: last}, count=_BATCH, block=block if waited else None)
            _raise_if_cancel_was_lost()
            entries = _entries(reply)
            if not entries:
                with self._errors(f"reading run {run_id!r}"):
                    exists = await client.exists(key)
                _raise_if_cancel_was_lost()
                if not exists:
                    why = "its log expired" if waited or offset else "has no log"
                    raise EventLogNotFoundError(f"event log {self.name}: run {run_id!r} {why}")
                waited = True
                continue
            for entry_id, fields in entries:
                if entry_id == FINISHED_ID:
                    return
                yield _index(entry_id), json.loads(fields[_FIELD])
                last = entry_id

    def _key(self, run_id: str) -> str:
        return f"{self._prefix}{run_id}:events"

    def _fence_key(self, run_id: str) -> str:
        return f"{self._prefix}{run_id}:epoch"

    def _connected(self) -> aioredis.Redis:
        if self._client is None:
            raise EventLogUnavailableError(f"event log {self.name} is not started (or closed)")
        return self._client

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """redis-py's errors as the log's; connection trouble (and timeouts) is unavailability."""
        try:
            yield
        except EventLogError:
            raise
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise EventLogUnavailableError(
                f"event log {self.name} is unavailable: {doing}: {self._scrub(exc)}"
            ) from exc
        except (RedisError, ValueError) as exc:
            raise EventLogError(f"event log {self.name}: {doing}: {self._scrub(exc)}") from exc

    def _scrub(self, exc: BaseException) -> str:
        """The client's message, first line only, with the password masked should it ever appear."""
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return text.replace(self._secret, "***") if self._secret else text


def _raise_if_cancel_was_lost() -> None:
    """Raise the cancellation a redis-py call returned through.

    redis-py sends each command inside `asyncio.wait_for` when a socket timeout is set, and Python
    3.11's wait_for drops a cancellation that lands as the send completes: the task stays
    "cancelling" but runs on, so a cancelled reader would keep polling until the log finished.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """XREAD's entries for the one stream read, from a RESP2 list or a RESP3 mapping."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(next(iter(reply.values())))
    return list(reply[0][1])


def _index(entry_id: str) -> int:
    return int(entry_id.partition("-")[0]) - 1


def _describe(url: str) -> str:
    """``redis://host:6379/0`` or ``unix:///path.sock``: the URL without credentials or options."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # the message could quote the URL, password included
        raise EventLogError("event log redis: the URL is malformed") from exc
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    if parts.scheme not in ("redis", "rediss"):
        raise EventLogError(
            f"event log redis: the URL's scheme must be redis, rediss or unix, not {parts.scheme!r}"
        )
    database = parts.path.strip("/") or "0"
    return f"{parts.scheme}://{parts.hostname or 'localhost'}:{port or 6379}/{database}"


def _password(url: str) -> str:
    return unquote(urlsplit(url).password or "")
