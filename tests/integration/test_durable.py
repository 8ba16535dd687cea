"""Durable runs in one process: a real SQLite store and the in-process event log, two replicas
(`DurableRuns`) sharing both. The multi-process take-over on PostgreSQL and Redis is in
tests/e2e/service/test_durable_takeover.py."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from procmesh_orchestrator import App, CallOptions
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.durable import DurableRuns
from procmesh_orchestrator.durable.config import DurableConfig
from procmesh_orchestrator.durable.events import MemoryEventLog
from procmesh_orchestrator.errors import EventLogError
from procmesh_orchestrator.run import snapshot
from procmesh_orchestrator.store import CANCELLED, DONE, FAILED, RUNNING, DurableRun, RunFence

WORDS = "one two three four five six seven eight nine ten"


STEP_0 = f'{{text: "{WORDS}", toolCalls: [{{name: lookup, args: {{}}}}]}}'
STEP_1 = f'{{text: "{WORDS}"}}'


def config(db: Path, *responses: str, delay_ms: float = 20) -> Config:
    """A durable agent whose scripted model gives `responses` (default: a tool call, then text).

    A scripted model's place in its script is per process: the replica that takes a run over
    is given the responses left, so the run reads the same as one that was never interrupted.
    """
    script = "\n".join(f"      - {r}" for r in responses or (STEP_0, STEP_1))
    text = f"""
storage: {{backend: sqlite, path: {db}}}
models:
  slow:
    provider: scripted
    delayMs: {delay_ms}
    responses:
{script}
tools: {{lookup: {{result: found}}}}
agents:
  d: {{model: slow, durable: true, errorProcessorDefaults: false, tools: [lookup], memory: {{}}}}
durable: {{leaseSeconds: 0.6, claimIntervalSeconds: 0.1}}
"""
    return Config.model_validate(yaml.safe_load(text))


@pytest.fixture
async def apps(tmp_path: Path) -> AsyncIterator[tuple[App, App]]:
    """Two replicas of one config on one SQLite file (each its own connection)."""
    db = tmp_path / "runs.db"
    async with App(config(db)) as a, App(config(db, STEP_1)) as b:
        yield a, b


async def read(
    durable: DurableRuns, run_id: str, offset: int = 0, *, stop_after: int | None = None
) -> list[Any]:
    got: list[Any] = []
    async with asyncio.timeout(20):
        async for off, chunk in durable.attach(run_id, offset):
            got.append((off, chunk))
            if stop_after is not None and len(got) >= stop_after:
                break
    return got


def texts(chunks: list[Any]) -> str:
    return "".join(c["payload"]["text"] for _, c in chunks if c["type"] == "text-delta")


async def test_a_durable_run_streams_through_its_log_and_is_recorded_done(apps: tuple[App, App]) -> None:
    a, _ = apps
    assert a.durable is not None
    told: list[tuple[str, str, str]] = []
    a.durable_ended.append(lambda agent_id, done: told.append((agent_id, done.run_id, done.status)))
    run_id = await a.durable.begin("d", "hi", CallOptions(thread_id="t1", resource_id="u1"))
    got = await read(a.durable, run_id)
    assert [off for off, _ in got] == list(range(len(got)))
    assert got[0][1]["type"] == "start"
    assert got[-1][1]["type"] == "finish"
    assert texts(got).replace(" ", "") == (WORDS * 2).replace(" ", "")
    store = await a.suspended_runs_store()
    record = await store.get_durable_run(run_id)
    assert record is not None
    assert (record.status, record.attempts) == (DONE, 1)
    assert await read(a.durable, run_id, 5) == got[5:]  # reattached after the end: the rest
    assert await a.durable.result(run_id) is not None
    assert told == [("d", run_id, "success")]  # its end told once (the service notes its warnings)


async def test_a_dead_replicas_run_is_taken_over_from_its_last_checkpoint(apps: tuple[App, App]) -> None:
    a, b = apps
    assert a.durable is not None
    assert b.durable is not None
    run_id = await a.durable.begin("d", "hi", CallOptions(thread_id="t2", resource_id="u1"))
    # past step 0 (its tool ran, the checkpoint holds it) into step 1's text
    seen = await read(a.durable, run_id, stop_after=20)
    assert any(c["type"] == "tool-result" for _, c in seen)
    await a.durable.close()  # replica A dies: nothing finished, the lease runs out
    await b.durable.close()  # B's own manager has its own in-memory log: the taker below shares A's

    # B reads the same log (in one process the in-memory log is shared by handing it over)
    told: list[tuple[str, str, str]] = []
    taker = DurableRuns(
        b.suspended_runs_store,
        a.durable.events,
        b.durable.agents,
        b.metrics,
        b.durable.settings,
        ended=[lambda agent_id, done: told.append((agent_id, done.run_id, done.status))],
    )
    await taker.start()
    try:
        rest = await read(taker, run_id, seen[-1][0] + 1)
        done = await taker.result(run_id)
    finally:
        await taker.close()
    assert done is not None
    # the run's end is told by the replica that took it over (its warnings are noted there), once
    assert told == [("d", run_id, "success")]
    offsets = [off for off, _ in seen + rest]
    assert offsets == list(range(len(offsets)))  # nothing lost, nothing twice
    assert rest[-1][1]["type"] == "finish"
    store = await b.suspended_runs_store()
    record = await store.get_durable_run(run_id)
    assert record is not None
    assert (record.status, record.attempts) == (DONE, 2)
    tool_results = [c for _, c in seen + rest if c["type"] == "tool-result"]
    assert len(tool_results) == 1  # step 0's tool is not run again: it was checkpointed
    # memory holds the turn once: the question and the answers of both steps, no duplicate ids
    stored = await store.messages("t2", "u1")
    assert stored[0]["role"] == "user"
    assert len({m["id"] for m in stored}) == len(stored)


async def test_cancel_stops_the_run_and_records_it_cancelled(apps: tuple[App, App]) -> None:
    a, _ = apps
    assert a.durable is not None
    run_id = await a.durable.begin("d", "hi", CallOptions())
    await read(a.durable, run_id, stop_after=4)
    await a.durable.cancel(run_id)
    got = await read(a.durable, run_id)
    assert got[-1][1]["type"] == "abort"
    store = await a.suspended_runs_store()
    record = await store.get_durable_run(run_id)
    assert record is not None
    assert record.status == CANCELLED


async def test_a_replica_whose_lease_was_taken_stops_publishing(
    apps: tuple[App, App], tmp_path: Path
) -> None:
    a, _ = apps
    assert a.durable is not None
    run_id = await a.durable.begin("d", "hi", CallOptions())
    await read(a.durable, run_id, stop_after=3)
    # What the row looks like after another replica claimed it (A paused past its lease, say):
    # written as that replica's claim writes it (the next epoch), on a connection of its own.
    with sqlite3.connect(tmp_path / "runs.db") as db:
        db.execute(
            "UPDATE durable_runs SET owner = 'thief', attempts = 2, epoch = 2 WHERE run_id = ?", (run_id,)
        )
    async with asyncio.timeout(10):  # A notices at its next renewal (or checkpoint) and stops
        while run_id in a.durable.local:  # noqa: ASYNC110 - no event to wait for: poll
            await asyncio.sleep(0.05)
    store = await a.suspended_runs_store()
    record = await store.get_durable_run(run_id)
    assert record is not None
    assert (record.status, record.owner, record.epoch) == (RUNNING, "thief", 2)  # A finished nothing
    assert a.metrics.registry.get_sample_value("procmesh_durable_runs_taken_over_total") == 0
    refused = [
        a.metrics.registry.get_sample_value("procmesh_durable_fenced_writes_total", {"write": write})
        for write in ("renewal", "checkpoint", "event", "memory", "finish")
    ]
    assert sum(n or 0 for n in refused) >= 1  # its first write under epoch 1 was refused


async def test_a_run_this_replica_cannot_resume_is_left_for_another_never_failed(
    apps: tuple[App, App],
) -> None:
    """A per-call processor list naming a processor this replica cannot bind: the run is given back
    at once, still running, counted as left (reason ``resume``), and not claimed again here."""
    a, b = apps
    assert a.durable is not None
    assert b.durable is not None
    call = {**snapshot.call_data(CallOptions()), "processorLists": {"output": ["nowhere/gone"]}}
    store = await a.suspended_runs_store()
    await store.create_durable_run(
        DurableRun("stray", "d", snapshot={"phase": "start", "input": "hi", "call": call}),
        owner="dead",
        lease_seconds=0.05,
    )
    left = "procmesh_durable_runs_left_total"

    def left_by(app: App) -> float:
        return app.metrics.registry.get_sample_value(left, {"reason": "resume"}) or 0.0

    async with asyncio.timeout(10):
        while left_by(a) + left_by(b) < 2:  # noqa: ASYNC110 - two replicas' claim loops: poll
            await asyncio.sleep(0.05)
    record = await store.get_durable_run("stray")
    assert record is not None
    # each replica claimed it once (epochs 2 and 3), gave it back and will not claim it again
    assert (record.status, record.error, record.epoch, record.owner) == (RUNNING, "", 3, "")
    assert (left_by(a), left_by(b)) == (1.0, 1.0)
    await asyncio.sleep(0.5)  # several claim intervals
    assert (await store.get_durable_run("stray")) == record


async def test_a_give_back_refused_for_its_epoch_is_counted_fenced(apps: tuple[App, App]) -> None:
    """A replica that claimed a run it cannot resume gives it back; when another replica claimed
    it since (the lease ran out first), the give-back is refused for its epoch: counted as a
    fenced ``release`` write, and the run stays the other replica's."""
    a, _ = apps
    assert a.durable is not None
    store = await a.suspended_runs_store()
    data = {"phase": "start", "input": "hi", "call": snapshot.call_data(CallOptions())}
    # of an agent neither replica's claim loop looks for: claimed here by hand, then resumed by A,
    # which has no such agent (as a replica without the agent's config)
    await store.create_durable_run(
        DurableRun("late", "gone", snapshot=data), owner="dead", lease_seconds=0.05
    )
    await asyncio.sleep(0.1)
    (mine,) = await store.claim_expired_durable_runs(owner=a.durable.replica, lease_seconds=0.05, limit=1)
    await asyncio.sleep(0.1)  # its lease ran out before it gave the run back: another claims it
    (theirs,) = await store.claim_expired_durable_runs(owner="rival", lease_seconds=30, limit=1)
    assert (mine.run_id, theirs.run_id, theirs.epoch) == ("late", "late", mine.epoch + 1)

    def fenced() -> float:
        found = a.metrics.registry.get_sample_value(
            "procmesh_durable_fenced_writes_total", {"write": "release"}
        )
        return found or 0.0

    before = fenced()
    await a.durable._try_take_over(store, mine)  # no agent "gone" here: gives it back
    assert fenced() == before + 1
    record = await store.get_durable_run("late")
    assert record is not None
    assert (record.owner, record.epoch, record.status) == ("rival", theirs.epoch, RUNNING)


async def test_a_run_the_event_log_fails_is_recorded_failed_without_naming_the_log(
    apps: tuple[App, App], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # the record's error is what GET /api/runs shows a client: never where the event log is
    a, _ = apps
    assert a.durable is not None
    assert a.events is not None
    appended = a.events.append

    async def failing(run_id: str, offset: int, chunk: Any, *, epoch: int) -> None:
        if offset >= 3:
            raise EventLogError("event log redis://log.internal:6379/0: run wrote past its end")
        await appended(run_id, offset, chunk, epoch=epoch)

    monkeypatch.setattr(a.events, "append", failing)
    run_id = await a.durable.begin("d", "hi", CallOptions(thread_id="t1", resource_id="u1"))
    async with asyncio.timeout(20):
        await a.durable.result(run_id)
    record = await (await a.suspended_runs_store()).get_durable_run(run_id)
    assert record is not None
    assert record.status == FAILED
    assert record.error == "the event log refused a chunk: the event log failed"
    assert "log.internal" in caplog.text  # the operator's log has the whole error


async def test_a_memory_save_under_an_epoch_taken_over_is_refused_and_stops_the_run(
    apps: tuple[App, App], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The split brain of issue 24: a replica paused just before its end-of-run memory save wakes
    after another replica claimed the run. The save goes through the run's real path (the memory
    processor, the store) and is refused for its epoch: nothing lands in the thread, and the run
    stops here (counted and logged with both epochs)."""
    a, _ = apps
    assert a.durable is not None
    store = await a.suspended_runs_store()
    events = MemoryEventLog()
    await events.start()
    # long leases: this replica's own clock never stops the run first; only the fence can
    settings = DurableConfig(lease_seconds=30, claim_interval_seconds=30)
    runner = DurableRuns(a.suspended_runs_store, events, a.durable.agents, a.metrics, settings)
    await runner.start()
    real_save = store.save_turn

    def claimed_by_another(run_id: str) -> None:
        with sqlite3.connect(tmp_path / "runs.db") as db:
            db.execute(
                "UPDATE durable_runs SET owner = 'thief', attempts = 2, epoch = 2 WHERE run_id = ?", (run_id,)
            )

    async def paused_then_saving(
        thread_id: str, resource_id: str, messages: list[Any], *, fence: RunFence | None = None
    ) -> None:
        assert fence is not None  # a durable run's save names its epoch
        await asyncio.to_thread(claimed_by_another, fence.run_id)  # while "paused"
        await real_save(thread_id, resource_id, messages, fence=fence)

    store.save_turn = paused_then_saving  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.WARNING, logger="procmesh_orchestrator.durable"):
            run_id = await runner.begin("d", "hi", CallOptions(thread_id="t9", resource_id="u1"))
            async with asyncio.timeout(20):
                assert await runner.result(run_id) is None  # stopped here, not finished
    finally:
        del store.save_turn
        await runner.close()
        await events.close()
    assert await store.messages("t9", "u1") == []  # the woken replica's turn never landed
    record = await store.get_durable_run(run_id)
    assert record is not None
    assert (record.status, record.owner, record.epoch) == (RUNNING, "thief", 2)
    memory = a.metrics.registry.get_sample_value("procmesh_durable_fenced_writes_total", {"write": "memory"})
    assert memory == 1
    assert f"run {run_id}: its memory under epoch 1 was refused: the run is at epoch" in caplog.text
