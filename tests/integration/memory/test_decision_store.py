"""The decision record in both real stores: one write per run, read by run and by time, the
retention purging old decisions as the next run writes, and a deleted thread taking its runs'
decisions along."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from procmesh_orchestrator.replay import source
from procmesh_orchestrator.store import Decision, MemoryStore, Thread, _decisions
from procmesh_orchestrator.store.decisions import RecordedInput

DAY = 86400.0


def _decision(run: str, outcome: str, at: datetime, **more: object) -> Decision:
    return Decision(
        run_id=run,
        agent_id="support",
        processor="pii",
        sidecar="guards",
        entry="pii",
        hook="process_input",
        step=0,
        outcome=outcome,
        at=at.isoformat(),
        **more,  # type: ignore[arg-type]
    )


async def test_a_runs_decisions_come_back_in_order_and_by_time(store: MemoryStore) -> None:
    now = datetime.now(UTC)
    first = [
        _decision("r1", "rewrite", now, latency_ms=1.5, seen="ab" * 32),
        _decision("r1", "monitor", now, would="abort", part=3),
        _decision("r1", "failed_open", now),
    ]
    await store.save_decisions(first, retention_seconds=DAY)
    await store.save_decisions([_decision("r2", "pass", now, content='{"x": 1}')], retention_seconds=DAY)
    got = await store.run_decisions("r1")
    assert [(d.outcome, d.would, d.part) for d in got] == [
        ("rewrite", "", None),
        ("monitor", "abort", 3),
        ("failed_open", "", None),
    ]
    assert (got[0].latency_ms, got[0].seen, got[0].content) == (1.5, "ab" * 32, None)
    assert (await store.run_decisions("r2"))[0].content == '{"x": 1}'
    assert await store.run_decisions("nobody") == []
    window = await store.decisions_between(
        (now - timedelta(minutes=1)).isoformat(), (now + timedelta(minutes=1)).isoformat()
    )
    assert [d.run_id for d in window] == ["r1", "r1", "r1", "r2"]
    later = await store.decisions_between(
        (now + timedelta(minutes=1)).isoformat(), (now + timedelta(minutes=2)).isoformat()
    )
    assert later == []
    assert (
        await store.decisions_between(
            (now - timedelta(minutes=1)).isoformat(),
            (now + timedelta(minutes=1)).isoformat(),
            agent_id="other",
        )
        == []
    )


async def test_the_retention_purges_old_decisions_as_a_run_writes(store: MemoryStore) -> None:
    old = datetime.now(UTC) - timedelta(days=3)
    await store.save_decisions([_decision("old", "pass", old)], retention_seconds=10 * DAY)
    assert len(await store.run_decisions("old")) == 1
    await store.save_decisions([_decision("new", "pass", datetime.now(UTC))], retention_seconds=DAY)
    assert await store.run_decisions("old") == []
    assert len(await store.run_decisions("new")) == 1


async def test_deleting_a_thread_deletes_its_runs_decisions(store: MemoryStore) -> None:
    await store.create_thread(Thread(id="t1", resource_id="alice"))
    now = datetime.now(UTC)
    await store.save_decisions(
        [
            _decision("r1", "abort", now, thread_id="t1", resource_id="alice"),
            _decision("r2", "pass", now, thread_id="t1", resource_id="bob"),
        ],
        retention_seconds=DAY,
    )
    await store.delete_thread("t1", "alice")
    assert await store.run_decisions("r1") == []
    assert len(await store.run_decisions("r2")) == 1  # bob's thread t1 is another thread


async def test_a_long_streams_thousand_decisions_are_kept_in_order(store: MemoryStore) -> None:
    now = datetime.now(UTC)
    parts = [_decision("long", "pass", now, part=i) for i in range(1000)]
    await store.save_decisions(parts, retention_seconds=DAY)
    assert [d.part for d in await store.run_decisions("long")] == list(range(1000))


def _input(run: str, kind: str, at: datetime, **more: str) -> RecordedInput:
    return RecordedInput(run, "support", kind, 0, '{"x": 1}', at.isoformat(), **more)


async def test_recorded_inputs_are_kept_with_the_run_and_purged_with_it(store: MemoryStore) -> None:
    now, old = datetime.now(UTC), datetime.now(UTC) - timedelta(days=3)
    await store.create_thread(Thread(id="t1", resource_id="alice"))
    await store.save_decisions(
        [],
        retention_seconds=10 * DAY,
        inputs=[
            _input("r1", "input", now, thread_id="t1", resource_id="alice"),
            _input("r1", "model-output", now, thread_id="t1", resource_id="alice"),
            _input("aged", "input", old),
        ],
    )
    assert [(i.kind, i.body) for i in await store.run_inputs("r1")] == [
        ("input", '{"x": 1}'),
        ("model-output", '{"x": 1}'),
    ]
    assert len(await store.run_inputs("aged")) == 1
    await store.save_decisions([], retention_seconds=DAY, inputs=[_input("r2", "input", now)])
    assert await store.run_inputs("aged") == []  # past the retention
    await store.delete_thread("t1", "alice")
    assert await store.run_inputs("r1") == []  # with its thread
    assert len(await store.run_inputs("r2")) == 1


async def test_runs_recorded_in_a_time_range_are_listed_oldest_first(store: MemoryStore) -> None:
    """What `procmesh replay --agent A --since T --until T` replays: each run whose input was
    recorded in the range, of that agent, once (its other recorded inputs do not repeat it)."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    at = [base + timedelta(minutes=m) for m in range(4)]
    other = RecordedInput("r-other", "billing", "input", 0, "{}", at[1].isoformat())
    await store.save_decisions(
        [],
        retention_seconds=3650 * DAY,
        inputs=[
            _input("r-late", "input", at[2]),
            _input("r-early", "input", at[0]),
            _input("r-early", "model-output", at[1]),
            _input("r-after", "input", at[3]),
            other,
        ],
    )
    since, until = at[0].isoformat(), at[3].isoformat()
    assert await store.recorded_runs(since, until, agent_id="support") == ["r-early", "r-late"]
    assert await store.recorded_runs(since, until) == ["r-early", "r-other", "r-late"]
    assert await store.recorded_runs(since, until, agent_id="support", limit=1) == ["r-early"]


async def test_a_replay_range_busier_than_one_store_read_lists_every_run(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store reads at most MAX_PAGE rows at once (10 000; 2 here): `procmesh replay --agent A
    --since T --until T` reads on, page after page, so every recorded run of a busy range and every
    run with only a decision record (three decisions each here) is replayed or listed."""
    monkeypatch.setattr(_decisions, "MAX_PAGE", 2)  # what the store gives at once
    monkeypatch.setattr(source, "MAX_PAGE", 2)  # what a replay asks it for
    base = datetime(2026, 1, 1, tzinfo=UTC)
    at = [base + timedelta(seconds=s) for s in range(20)]
    recorded = [_input(f"r-{i}", "input", at[i]) for i in range(5)]
    decided = [_decision(f"d-{i // 3}", "pass", at[5 + i]) for i in range(9)]
    await store.save_decisions(decided, retention_seconds=3650 * DAY, inputs=recorded)
    runs = await source.runs_between(store, at[0].isoformat(), at[19].isoformat(), "support")
    assert runs == [f"r-{i}" for i in range(5)] + ["d-0", "d-1", "d-2"]
