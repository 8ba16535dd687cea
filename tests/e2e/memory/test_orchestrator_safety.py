"""Data safety of memory through real `procmesh-orchestrator` processes and the HTTP API.

- Two orchestrators on one PostgreSQL, 200 concurrent runs over 20 threads (a trusted setup, so
  the body names thread and resource): every turn saved exactly once, whole (its user message right
  before its answer), nothing of a turn an output guard aborted; then turns sent one after another
  on each thread (alternating orchestrators) are stored in call order.
- An orchestrator SIGKILLed while it is inside a turn's save transaction leaves every turn whole
  or absent, on SQLite and on PostgreSQL (`test_store_safety` aims the kill the same way).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from procmesh_orchestrator.sidecar_process import SidecarProcess
from procmesh_orchestrator.store import StorageConfig, open_store
from tests.e2e.memory.test_store_safety import postgres_dsn, postgres_writing, sqlite_writing
from tests.e2e.service.conftest import OrchestratorProcess, start_orchestrator
from tests.integration.memory.pg import fresh_dsn

pytestmark = pytest.mark.e2e

__all__ = ["postgres_dsn", "start_orchestrator"]  # fixtures shared with the modules they come from

THREADS = 20
RUNS = 200
TRUSTED = {"PROCMESH_TRUST_REQUEST_CONTEXT": "true"}
WORD = "forbidden"


@pytest.fixture(scope="module")
def guard(start_sidecar: Callable[..., SidecarProcess]) -> str:
    proc = start_sidecar("regex-filter", name="memory-safety-guard")
    asyncio.run(proc.wait_ready())
    return proc.address


def config(storage: dict[str, Any], guard: str | None) -> dict[str, Any]:
    agent: dict[str, Any] = {
        "model": "demo",
        "errorProcessorDefaults": False,
        "memory": {"lastMessages": 4},
    }
    out: dict[str, Any] = {
        "storage": storage,
        "models": {"demo": {"provider": "demo"}},
        "agents": {"chat": agent},
    }
    if guard is not None:
        out["sidecars"] = {"guard": {"address": guard, "timeout": 30}}
        # An output guard: the model answers (echoing the word), then the turn is aborted.
        rule = {"name": "word", "pattern": WORD}
        options = {"rules": [rule], "strategy": "block", "phase": "output"}
        agent["outputProcessors"] = [{"processor": "guard/regex-filter", "options": options}]
    return out


def body(text: str | list[str], thread: str, resource: str = "user-1") -> dict[str, Any]:
    messages = text if isinstance(text, list) else [text]
    return {
        "messages": [{"role": "user", "content": m} for m in messages],
        "memory": {"thread": thread, "resource": resource},
    }


def stored(storage: StorageConfig, threads: list[str]) -> dict[str, list[dict[str, Any]]]:
    async def read() -> dict[str, list[dict[str, Any]]]:
        store = open_store(storage)
        await store.start()
        try:
            return {t: await store.messages(t, "user-1") for t in threads}
        finally:
            await store.close()

    return asyncio.run(read())


def text(msg: dict[str, Any]) -> str:
    return " ".join(p.get("text", "") for p in msg["content"]["parts"] if p["type"] == "text")


def test_two_orchestrators_200_concurrent_runs_save_each_turn_once_and_nothing_aborted(
    postgres_dsn: str, guard: str, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    dsn = fresh_dsn(postgres_dsn)
    cfg = config({"backend": "postgres", "dsn": dsn, "maxConnections": 20}, guard)
    replicas = [start_orchestrator(cfg, env=TRUSTED), start_orchestrator(cfg, env=TRUSTED)]
    aborted = {i for i in range(RUNS) if i % 7 == 3}

    async def traffic() -> tuple[list[int], float]:
        limits = httpx.Limits(max_connections=RUNS)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:

            async def one(i: int, thread: str, replica: OrchestratorProcess, words: str) -> int:
                url = f"{replica.http_url}/api/agents/chat/generate"
                response = await http.post(url, json=body(words, thread))
                return response.status_code

            started = time.monotonic()
            codes = await asyncio.gather(
                *(
                    one(
                        i,
                        f"t{i % THREADS}",
                        replicas[i % 2],
                        f"turn {i}" + (f" {WORD}" if i in aborted else ""),
                    )
                    for i in range(RUNS)
                )
            )
            elapsed = time.monotonic() - started
            for k in range(3):  # then one turn at a time per thread, replicas alternating
                await asyncio.gather(
                    *(one(0, f"t{t}", replicas[(t + k) % 2], f"ordered {t} {k}") for t in range(THREADS))
                )
            return list(codes), elapsed

    codes, elapsed = asyncio.run(traffic())
    assert set(codes) == {200}
    threads = stored(StorageConfig(backend="postgres", dsn=dsn), [f"t{t}" for t in range(THREADS)])
    saved: list[int] = []
    for thread, messages in threads.items():
        roles = [m["role"] for m in messages]
        assert roles == ["user", "assistant"] * (len(messages) // 2), thread  # whole turns, never interleaved
        for question, answer in zip(messages[::2], messages[1::2], strict=True):
            assert text(question) in text(answer)  # the demo model echoes this turn's own question
            if text(question).startswith("turn "):
                saved.append(int(text(question).split()[1]))
        assert WORD not in " ".join(text(m) for m in messages)
        ordered = [text(q) for q in messages[::2] if text(q).startswith("ordered ")]
        assert ordered == [f"ordered {thread[1:]} {k}" for k in range(3)], thread  # call order, at the end
    assert sorted(saved) == sorted(set(range(RUNS)) - aborted)  # each exactly once, no aborted turn
    print(
        f"\n[memory safety] 2 orchestrators, 1 PostgreSQL: {RUNS} concurrent runs over {THREADS} threads in "
        f"{elapsed:.1f}s; {len(saved)} turns saved once each, {len(aborted)} aborted turns saved 0 times; "
        f"+{THREADS * 3} sequential turns stored in call order"
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sigkill_while_saving_a_turn_leaves_it_whole_or_absent(
    backend: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> None:
    rounds, parts, size = 3, 4, 48 * 1024
    application = f"pm-orch-kill-{backend}"
    if backend == "sqlite":
        location = str(tmp_path / "memory.db")
        storage: dict[str, Any] = {"path": location}
        store_config = StorageConfig(path=location)
        admin = None
    else:
        base = fresh_dsn(request.getfixturevalue("postgres_dsn"))
        location = make_conninfo(base, application_name=application)
        storage = {"backend": "postgres", "dsn": location}
        store_config = StorageConfig(backend="postgres", dsn=base)
        admin = psycopg.connect(base, autocommit=True)
        request.addfinalizer(admin.close)
    threads = [f"k{t}" for t in range(4)]
    aimed = 0
    answered: set[str] = set()
    for r in range(rounds):
        replica = start_orchestrator(config(storage, None), env=TRUSTED)
        stop = threading.Event()

        async def traffic(
            replica: OrchestratorProcess = replica, r: int = r, stop: threading.Event = stop
        ) -> None:
            async with httpx.AsyncClient(timeout=60) as http:

                async def chain(t: int) -> None:
                    n = 0
                    while not stop.is_set():
                        tag = f"r{r}-t{t}-n{n}"
                        words = [f"{tag} part {k} " + "x" * size for k in range(parts)]
                        try:
                            response = await http.post(
                                f"{replica.http_url}/api/agents/chat/generate", json=body(words, threads[t])
                            )
                        except httpx.HTTPError:
                            return  # the orchestrator was killed under this call
                        if response.status_code == 200:
                            answered.add(tag)
                        n += 1

                await asyncio.gather(*(chain(t) for t in range(len(threads))))

        def killer(replica: OrchestratorProcess = replica, r: int = r, stop: threading.Event = stop) -> None:
            nonlocal aimed
            time.sleep(1.0 + 0.5 * r)  # a few turns saved first
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if sqlite_writing(location) if admin is None else postgres_writing(admin, application):
                    aimed += 1
                    break
            os.killpg(replica.proc.pid, signal.SIGKILL)
            stop.set()

        async def both() -> None:
            await asyncio.gather(traffic(), asyncio.to_thread(killer))

        asyncio.run(both())
        assert replica.proc.wait(10) == -signal.SIGKILL
    whole = 0
    stored_tags: set[str] = set()
    for thread, messages in stored(store_config, threads).items():
        turns: dict[str, list[str]] = {}
        sequence: list[str] = []
        for msg in messages:
            # a part starts with its turn's tag; the demo model's answer quotes the last part
            tag = text(msg).split()[0] if msg["role"] == "user" else text(msg).split('"')[1].split()[0]
            sequence.append(tag)
            turns.setdefault(tag, []).append(msg["role"])
        for tag, roles in turns.items():  # whole: every part and the answer
            assert roles == ["user"] * parts + ["assistant"], (thread, tag, roles)
            whole += 1
        # and contiguous: one turn's messages are never split by another's
        runs = [tag for i, tag in enumerate(sequence) if i == 0 or sequence[i - 1] != tag]
        assert len(runs) == len(turns), thread
        stored_tags |= set(turns)
    assert answered <= stored_tags  # a call answered 200 had its turn committed first
    print(
        f"\n[memory safety] {backend}: {rounds} orchestrators SIGKILLed ({aimed} inside a save transaction); "
        f"{whole} turns stored, every one whole ({parts} parts + answer), none half-written"
    )
