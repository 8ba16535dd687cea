"""What the durable-run e2e tests share: a restartable redis-server, the replicas' config, and an
SSE client that records every ``(id, chunk)`` a durable stream sends and reattaches by offset.

Redis runs with the append-only file on (fsync always), so stopping it and starting it again on the
same socket keeps the run logs, as a Redis deployed for durable runs would.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import httpx
import redis

from procmesh_orchestrator.durable.events.redis_streams import FINISHED_ID
from tests.deps import require

WAIT = 20.0
"""The bound on every wait for something to happen (never an assertion on how long it took)."""
AGENT = "durable-teller"
KEYS = "key-ada=user-ada,key-op=@operator"
AUTH = {"Authorization": "Bearer key-ada"}
OPERATOR_AUTH = {"Authorization": "Bearer key-op"}
"""An operator key: it may replace an agent's processors for a call (a tenant key may not)."""
ASK = "What is the weather like?"
DSN_ENV = "PROCMESH_DURABLE_DSN"
REDIS_ENV = "PROCMESH_DURABLE_REDIS"
ANSWER = "The tool says: {'celsius': 21, 'forecast': 'sunny'}. That should answer it."


class RedisServer:
    """redis-server on a unix socket in a private folder; its data survives `stop` and `start`."""

    def __init__(self) -> None:
        self.binary = require("redis-server")
        self.folder = Path(tempfile.mkdtemp(prefix="pm-durable-redis-"))
        self.socket = self.folder / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = ["--port", "0", "--unixsocket", str(self.socket), "--save", ""]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.folder)]
        self.proc = subprocess.Popen(
            [self.binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.Redis(unix_socket_path=str(self.socket))
        deadline = time.monotonic() + WAIT
        try:
            while True:
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, redis.BusyLoadingError, OSError):
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        self.proc.kill()
                        raise
                    time.sleep(0.05)
        finally:
            client.close()

    def logged_offsets(self, run_id: str) -> list[int]:
        """The offsets the run's log holds, read from Redis itself (without the finished mark)."""
        client = redis.Redis(unix_socket_path=str(self.socket), decode_responses=True)
        try:
            # redis-py's sync client is typed for its async twin too: a list here
            entries = cast("list[tuple[str, Any]]", client.xrange(f"procmesh:run:{run_id}:events"))
        finally:
            client.close()
        ids = [entry_id for entry_id, _ in entries]
        return [int(i.partition("-")[0]) - 1 for i in ids if i != FINISHED_ID]

    def stop(self) -> None:
        """SIGTERM: redis-server flushes the append-only file and exits."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=WAIT)
            self.proc = None


def replica_config(
    *,
    delay_ms: float = 120.0,
    lease_seconds: float = 1.5,
    claim_interval_seconds: float = 0.3,
    guards: str | None = None,
) -> dict[str, Any]:
    """Replicas' shared config: PostgreSQL (dsnEnv), the Redis event log (urlEnv), one durable
    agent with memory on the demo model (paced by `delay_ms` between deltas).

    The demo model, not a scripted one: a scripted model's place in its script is per process,
    so the replica that takes a run over would answer it from the script's start. The demo model
    answers from the prompt alone: it calls ``weather`` for a weather question (step 0), then
    answers from the tool's result (step 1), the same on every replica.

    `guards`: the address of an examples sidecar; the agent's output lane then masks "sunny" (the
    word filter), so a run that runs the agent's lane shows it.
    """
    config: dict[str, Any] = {
        "storage": {"backend": "postgres", "dsnEnv": DSN_ENV},
        "durable": {
            "leaseSeconds": lease_seconds,
            "claimIntervalSeconds": claim_interval_seconds,
            "eventLog": {"backend": "redis", "urlEnv": REDIS_ENV},
        },
        "models": {"demo": {"provider": "demo", "delayMs": delay_ms}},
        "tools": {
            "weather": {
                "description": "The weather in a city.",
                "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
                "result": {"celsius": 21, "forecast": "sunny"},
            }
        },
        "agents": {
            AGENT: {
                "model": "demo",
                "errorProcessorDefaults": False,
                "tools": ["weather"],
                "memory": {"lastMessages": 20},
                "durable": True,
            }
        },
    }
    if guards is not None:
        config["sidecars"] = {"guards": {"address": guards}}
        masked = {"processor": "guards/word-filter", "options": {"words": ["sunny"]}}
        config["agents"][AGENT]["outputProcessors"] = [masked]
    return config


@dataclass
class Received:
    """What one client got of one run, over all its connections."""

    run_id: str = ""
    events: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """Every ``(offset, chunk)`` in the order it arrived."""
    done: bool = False
    """The stream ended with ``[DONE]``."""
    connections: int = 0
    cuts: list[dict[str, Any]] = field(default_factory=list)
    """The error chunks (without an id) of streams the server ended before the run's end."""

    @property
    def next_offset(self) -> int:
        return self.events[-1][0] + 1 if self.events else 0

    @property
    def chunks(self) -> list[dict[str, Any]]:
        return [chunk for _, chunk in self.events]


async def sse_records(response: httpx.Response) -> AsyncIterator[tuple[str | None, str]]:
    """The ``(id, data)`` of each event of a text/event-stream response (id None when it has none;
    a durable stream sends each chunk's id in an event of its own just before it)."""
    buffer = ""
    ident: str | None = None
    async for text in response.aiter_text():
        buffer += text
        while "\n\n" in buffer:
            event, buffer = buffer.split("\n\n", 1)
            data: list[str] = []
            for line in event.splitlines():
                if line.startswith("id:"):
                    ident = line[3:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))
            if data:
                yield ident, "\n".join(data)
                ident = None


async def read_stream(
    response: httpx.Response,
    into: Received,
    *,
    stop_after: int | None = None,
    on_event: Callable[[Received], None] | None = None,
) -> None:
    """Record the response's events into `into` until ``[DONE]``, the connection's end, or
    `stop_after` new events (then return, leaving the caller to close the connection)."""
    assert response.status_code == 200, (await response.aread()).decode()
    into.connections += 1
    new = 0
    try:
        async for ident, data in sse_records(response):
            if data == "[DONE]":
                into.done = True
                return
            chunk = json.loads(data)
            if ident is None and chunk["type"] in ("text-start", "text-end"):
                continue  # the connection's framing of the text deltas, no event of the run's log
            if ident is None:  # not an event of the run: the server cut the stream (its log failed)
                assert chunk["type"] == "error", f"a durable stream's event without an id: {data}"
                into.cuts.append(chunk)
                return
            into.run_id = into.run_id or response.headers.get("x-run-id", "")
            into.events.append((int(ident), chunk))
            if on_event is not None:
                on_event(into)
            new += 1
            if stop_after is not None and new >= stop_after:
                return
    except (httpx.RemoteProtocolError, httpx.ReadError):  # the replica died under the stream
        return


async def observe(
    client: httpx.AsyncClient, base_url: str, into: Received, *, stop_after: int | None = None
) -> None:
    """Reattach to the run from the next offset this client lacks and read on."""
    body = {"runId": into.run_id, "offset": into.next_offset}
    async with client.stream(
        "POST", f"{base_url}/api/agents/{AGENT}/observe", json=body, headers=AUTH
    ) as response:
        await read_stream(response, into, stop_after=stop_after)


def run_record(base_url: str, run_id: str) -> dict[str, Any]:
    """GET /api/runs/{id}: the durable run as the store has it."""
    response = httpx.get(f"{base_url}/api/runs/{run_id}", headers=AUTH, timeout=WAIT)
    assert response.status_code == 200, response.text
    record: dict[str, Any] = response.json()
    return record


def thread_messages(base_url: str, thread_id: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{base_url}/api/memory/threads/{thread_id}/messages",
        params={"agentId": AGENT},
        headers=AUTH,
        timeout=WAIT,
    )
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def comparable(chunks: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Chunks as (type, payload), without the ids that differ between runs (run, tool call)."""
    out: list[tuple[str, Any]] = []
    for chunk in chunks:
        payload = chunk.get("payload") or {}
        kept = {k: v for k, v in payload.items() if k not in ("toolCallId", "runId", "messageId")}
        out.append((chunk["type"], kept))
    return out


def log_times(log_text: str, needle: str) -> list[float]:
    """The times (epoch seconds) of JSON log lines whose message contains `needle`."""
    out = []
    for line in log_text.splitlines():
        if not line.startswith("{"):
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if needle in entry.get("message", ""):
            out.append(datetime.fromisoformat(entry["time"].replace("Z", "+00:00")).timestamp())
    return out


async def until(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Wait (polling) until `check()` holds; fail naming `what` after `timeout` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not check():  # noqa: ASYNC110 - state of other processes: poll
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


def env_for(dsn: str, redis_url: str) -> dict[str, str]:
    return {"PROCMESH_API_KEYS": KEYS, DSN_ENV: dsn, REDIS_ENV: redis_url}
