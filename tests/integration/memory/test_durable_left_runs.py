"""Expired durable runs of agents a replica lacks, beyond one page of them, on both backends: the
store pages them with a keyset cursor and counts them all, and the claim loop counts each in
``procmesh_durable_runs_left_total{reason="agent"}`` and logs their true number (it used to list
the 100 oldest only: the rest were neither counted nor logged, and the line said 100)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest

from procmesh_orchestrator.durable import DurableRuns, takeover
from procmesh_orchestrator.durable.config import DurableConfig
from procmesh_orchestrator.durable.events import MemoryEventLog
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.store import MemoryStore
from tests.integration.memory.test_durable_runs import TINY, durable

RUNS = 105
"""More than the 100 a look used to list."""


async def _left_behind(store: MemoryStore) -> list[str]:
    """`RUNS` runs of agent ``gone`` whose lease expired (on the database's clock), in creation order."""
    ids = [f"r{i:03d}" for i in range(RUNS)]
    for run_id in ids:
        await store.create_durable_run(durable(run_id, agent_id="gone"), owner="dead", lease_seconds=TINY)
    for _ in range(400):
        if len(await store.unclaimable_durable_runs(agents=["here"], limit=1000)) == RUNS:
            break
        await asyncio.sleep(0.01)
    return ids


async def test_the_store_pages_and_counts_every_run_left_to_others(store: MemoryStore) -> None:
    ids = await _left_behind(store)
    seen: list[str] = []
    after: str | None = None
    while True:
        page = await store.unclaimable_durable_runs(agents=["here"], limit=40, after=after)
        seen += [r.run_id for r in page]
        if len(page) < 40:
            break
        after = page[-1].run_id
    assert seen == ids  # oldest first, each once
    assert await store.count_unclaimable_durable_runs(agents=["here"]) == RUNS
    assert await store.count_unclaimable_durable_runs(agents=["gone"]) == 0
    assert await store.unclaimable_durable_runs(agents=["here"], limit=5, after=ids[-1]) == []


async def _claim_loop_until(store: MemoryStore, done: Callable[[OrchestratorMetrics], bool]) -> float | None:
    """A replica with agent ``here`` alone claims until `done(its metrics)`; its count of runs
    left for their agent then."""
    metrics = OrchestratorMetrics()

    async def opened() -> MemoryStore:
        return store

    replica = DurableRuns(
        opened, MemoryEventLog(), {}, metrics, DurableConfig(claim_interval_seconds=0.05), replica="here"
    )
    await replica.start()
    try:
        async with asyncio.timeout(20):
            while not done(metrics):  # noqa: ASYNC110 - another task's counter or log line: poll
                await asyncio.sleep(0.05)
    finally:
        await replica.close()
    return _left(metrics)


def _left(metrics: OrchestratorMetrics) -> float | None:
    return metrics.registry.get_sample_value("procmesh_durable_runs_left_total", {"reason": "agent"})


async def test_the_claim_loop_counts_and_logs_every_run_left_to_others(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    await _left_behind(store)
    caplog.set_level(logging.WARNING, logger="procmesh_orchestrator.durable")
    left = await _claim_loop_until(store, lambda _: "are left for a replica" in caplog.text)
    assert left == RUNS
    assert f"{RUNS} expired durable run(s) of agent(s) this replica's config lacks ('gone')" in caplog.text


async def test_a_look_that_reads_fewer_runs_than_are_left_logs_their_true_number(
    store: MemoryStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A look reads at most `_LEFT_PAGES` pages (one here, of 100): its log line gives the store's
    count of every run left, not the number that look read, and the next looks count the rest."""
    monkeypatch.setattr(takeover, "_LEFT_PAGES", 1)
    await _left_behind(store)
    caplog.set_level(logging.WARNING, logger="procmesh_orchestrator.durable")
    assert await _claim_loop_until(store, lambda metrics: _left(metrics) == RUNS) == RUNS
    (line,) = [r.getMessage() for r in caplog.records if "are left for a replica" in r.getMessage()]
    assert line.startswith(f"{RUNS} expired durable run(s) of agent(s) this replica's config lacks ('gone')")
