"""The fence in the MemoryStore contract, on both backends: every write of a durable run names the
epoch its writer holds (1 at creation, one more at every claim) and is refused, with nothing
written, once the run's epoch moved on — its checkpoint, renewal, finish and release, its memory
save, its suspension and its cost reservations. A fenced memory save is the run's turn, once
(a save repeated after a take-over replaces it). Claims take only the agents a replica has."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from procmesh_orchestrator.errors import (
    DurableRunNotFoundError,
    FencedWriteError,
    InvalidMemoryInputError,
    LeaseLostError,
)
from procmesh_orchestrator.store import DurableRun, MemoryStore, RunFence, SuspendedRun
from tests.integration.memory.test_durable_runs import LONG, TINY, claim_eventually, durable, stored
from tests.integration.memory.test_store_contract import ids, msg

STALE = RunFence("r1", 1)
"""The creator's fence, once another replica claimed r1 (epoch 2)."""
CURRENT = RunFence("r1", 2)


async def taken_over(store: MemoryStore, **changes: Any) -> DurableRun:
    """r1, created by "a" at epoch 1 with a lease that expires at once, claimed by "b" (epoch 2)."""
    await store.create_durable_run(durable(**changes), owner="a", lease_seconds=TINY)
    [claimed] = await claim_eventually(store, "b")
    assert (claimed.run_id, claimed.owner, claimed.epoch) == ("r1", "b", 2)
    return claimed


def suspended(run_id: str = "r1", step: int = 1) -> SuspendedRun:
    return SuspendedRun(
        run_id=run_id,
        agent_id="agent",
        thread_id="t1",
        resource_id="alice",
        tool_call_ids=("call-1",),
        snapshot={"step": step},
    )


async def test_a_created_run_is_at_epoch_1_and_each_claim_raises_it(store: MemoryStore) -> None:
    created = await store.create_durable_run(durable(), owner="a", lease_seconds=TINY)
    assert created.epoch == 1
    [first] = await claim_eventually(store, "b")
    assert first.epoch == 2
    # given up: claimable at once, which on SQLite's millisecond clock is from the next millisecond
    await store.release_durable_run("r1", owner="b", epoch=2)
    [second] = await claim_eventually(store, "c")
    assert (second.owner, second.epoch, second.attempts) == ("c", 3, 3)
    assert (await stored(store)).epoch == 3


async def test_the_stale_epochs_run_writes_are_refused_and_write_nothing(store: MemoryStore) -> None:
    await taken_over(store)
    await store.checkpoint_durable_run("r1", owner="b", epoch=2, snapshot={"step": 2}, lease_seconds=LONG)
    before = await stored(store)
    writes = [
        store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot={"stale": 1}, lease_seconds=LONG),
        store.renew_durable_lease("r1", owner="a", epoch=1, lease_seconds=LONG),
        store.finish_durable_run("r1", owner="a", epoch=1, status="done"),
        store.release_durable_run("r1", owner="a", epoch=1),
        # the claimant's own name under the old epoch (a replica that claimed its run back) too
        store.checkpoint_durable_run("r1", owner="b", epoch=1, snapshot={"stale": 2}, lease_seconds=LONG),
    ]
    for write in writes:
        with pytest.raises(FencedWriteError, match="under epoch 1 refused: the run is at epoch 2") as refused:
            await write
        assert (refused.value.epoch, refused.value.current) == (1, 2)
    assert await stored(store) == before
    await store.finish_durable_run("r1", owner="b", epoch=2, status="done")
    assert (await stored(store)).status == "done"


async def test_a_stale_memory_save_is_refused_and_the_thread_keeps_one_answer(store: MemoryStore) -> None:
    await taken_over(store)
    question = msg("u1")
    await store.save_turn("t1", "alice", [question, msg("b-answer", "assistant")], fence=CURRENT)
    with pytest.raises(FencedWriteError, match="saving a turn to thread 't1' under epoch 1 refused"):
        await store.save_turn("t1", "alice", [question, msg("a-answer", "assistant")], fence=STALE)
    assert ids(await store.messages("t1", "alice")) == ["u1", "b-answer"]
    with pytest.raises(FencedWriteError):  # not even into another thread
        await store.save_turn("t2", "alice", [msg("a-other")], fence=STALE)
    assert await store.messages("t2", "alice") == []


async def test_a_fenced_save_repeated_after_a_take_over_replaces_the_runs_turn(store: MemoryStore) -> None:
    """The "saved, then died before finish" window: A saved the turn at epoch 1 and died; B runs
    the last step again (its answer has a new id) and saves: the thread holds the run's turn once."""
    await store.save_turn("t1", "alice", [msg("earlier"), msg("earlier-answer", "assistant")])
    await store.create_durable_run(durable(), owner="a", lease_seconds=TINY)
    await store.save_turn("t1", "alice", [msg("u1"), msg("a-answer", "assistant")], fence=STALE)
    await store.save_turn("t1", "alice", [msg("u1"), msg("a-answer", "assistant")], fence=STALE)  # retried
    assert ids(await store.messages("t1", "alice")) == ["earlier", "earlier-answer", "u1", "a-answer"]
    await claim_eventually(store, "b")
    await store.save_turn(
        "t1", "alice", [msg("u1"), msg("b-call", "assistant"), msg("b-answer", "assistant")], fence=CURRENT
    )
    assert ids(await store.messages("t1", "alice")) == [
        "earlier",
        "earlier-answer",
        "u1",
        "b-call",
        "b-answer",
    ]
    # another run's turn in the thread is untouched by r1's
    await store.create_durable_run(durable("r2"), owner="c", lease_seconds=LONG)
    await store.save_turn("t1", "alice", [msg("u2"), msg("r2-answer", "assistant")], fence=RunFence("r2", 1))
    assert ids(await store.messages("t1", "alice"))[-2:] == ["u2", "r2-answer"]
    assert len(await store.messages("t1", "alice")) == 7


async def test_a_fenced_save_to_a_run_that_ended_is_refused(store: MemoryStore) -> None:
    await store.create_durable_run(durable(), owner="a", lease_seconds=LONG)
    await store.finish_durable_run("r1", owner="a", epoch=1, status="done")
    with pytest.raises(LeaseLostError, match="is done, no longer running"):
        await store.save_turn("t1", "alice", [msg("late")], fence=RunFence("r1", 1))
    with pytest.raises(DurableRunNotFoundError):
        await store.save_turn("t1", "alice", [msg("late")], fence=RunFence("ghost", 1))
    assert await store.messages("t1", "alice") == []


async def test_a_stale_suspension_is_refused(store: MemoryStore) -> None:
    await taken_over(store)
    with pytest.raises(FencedWriteError, match="suspending under epoch 1 refused"):
        await store.save_suspended(suspended(step=1), fence=STALE)
    assert (await store.list_suspended("agent"))[1] == 0
    await store.save_suspended(suspended(step=2), fence=CURRENT)
    runs, total = await store.list_suspended("agent")
    assert (total, runs[0].snapshot) == (1, {"step": 2})


async def test_stale_cost_writes_are_refused_and_the_ledger_is_unchanged(store: MemoryStore) -> None:
    await store.create_durable_run(durable(), owner="a", lease_seconds=TINY)
    reserve = {"limit": 10_000, "window_seconds": 3600.0}
    assert (await store.reserve_cost("scope", "res-a", 100, fence=STALE, **reserve)).admitted
    await claim_eventually(store, "b")
    with pytest.raises(FencedWriteError, match="reserving cost in 'scope' under epoch 1 refused"):
        await store.reserve_cost("scope", "res-a2", 500, fence=STALE, **reserve)
    with pytest.raises(FencedWriteError, match="settling cost reservation 'res-a' under epoch 1"):
        await store.settle_cost("res-a", 7, fence=STALE)
    with pytest.raises(FencedWriteError, match="releasing cost reservation 'res-a' under epoch 1"):
        await store.release_cost("res-a", fence=STALE)
    assert await store.spent_cost("scope", window_seconds=3600.0) == 100  # the estimate, as it was
    admission = await store.reserve_cost("scope", "res-b", 50, fence=CURRENT, **reserve)
    assert (admission.admitted, admission.spent) == (True, 100)
    await store.settle_cost("res-b", 20, fence=CURRENT)
    assert await store.spent_cost("scope", window_seconds=3600.0) == 120


async def test_a_fence_that_is_not_one_is_refused(store: MemoryStore) -> None:
    await store.create_durable_run(durable(), owner="a", lease_seconds=LONG)
    for bad, pattern in [
        (("r1", 1), "a fence is a RunFence, not tuple"),
        (RunFence("r1", 0), "epoch must be an integer from 1"),
        (RunFence("", 1), "run id '' must not be empty"),
    ]:
        with pytest.raises(InvalidMemoryInputError, match=pattern):
            await store.save_turn("t1", "alice", [msg("x")], fence=bad)  # type: ignore[arg-type]
    assert await store.messages("t1", "alice") == []


# --- claims: only the agents a replica has ---------------------------------------------------------


async def test_a_claim_takes_only_runs_of_the_agents_it_names(store: MemoryStore) -> None:
    for run_id, agent in [("r1", "old-agent"), ("r2", "agent"), ("r3", "old-agent")]:
        await store.create_durable_run(
            durable(run_id, agent_id=agent, config_version=f"v-{agent}"), owner="dead", lease_seconds=TINY
        )
    for _ in range(400):  # until all three leases expired on the database's clock
        if len(await store.unclaimable_durable_runs(agents=["nothing"], limit=10)) == 3:
            break
        await asyncio.sleep(0.01)
    assert await store.claim_expired_durable_runs(owner="new", lease_seconds=LONG, limit=10, agents=[]) == []
    left = await store.unclaimable_durable_runs(agents=["agent"], limit=10)
    assert sorted(r.run_id for r in left) == ["r1", "r3"]
    assert all(r.snapshot == {} for r in left)
    [taken] = await store.claim_expired_durable_runs(
        owner="new", lease_seconds=LONG, limit=10, agents=["agent"]
    )
    assert (taken.run_id, taken.agent_id, taken.config_version) == ("r2", "agent", "v-agent")
    assert [r.owner for r in [await stored(store, "r1"), await stored(store, "r3")]] == ["dead", "dead"]
    got = await store.claim_expired_durable_runs(
        owner="old", lease_seconds=LONG, limit=10, agents=["old-agent"], exclude=["r1"]
    )
    assert [r.run_id for r in got] == ["r3"]
    assert [r.run_id for r in await store.unclaimable_durable_runs(agents=["agent"], limit=10)] == ["r1"]


async def test_a_claim_whose_fence_hook_fails_claims_nothing(store: MemoryStore) -> None:
    await store.create_durable_run(durable(), owner="a", lease_seconds=TINY)
    seen: list[tuple[str, int, str]] = []

    async def failing(runs: list[DurableRun]) -> None:
        seen.extend((r.run_id, r.epoch, r.owner) for r in runs)
        raise RuntimeError("the event log is gone")

    for _ in range(400):
        try:
            await store.claim_expired_durable_runs(
                owner="b", lease_seconds=LONG, limit=5, before_commit=failing
            )
        except RuntimeError:
            break
        await asyncio.sleep(0.01)
    assert seen == [("r1", 2, "b")]  # the hook saw the claim as it would commit
    run = await stored(store)
    assert (run.owner, run.epoch, run.attempts) == ("a", 1, 1)  # rolled back
    fenced: list[int] = []

    async def fence(runs: list[DurableRun]) -> None:
        fenced.extend(r.epoch for r in runs)

    [claimed] = await store.claim_expired_durable_runs(
        owner="b", lease_seconds=LONG, limit=5, before_commit=fence
    )
    assert (claimed.epoch, fenced) == (2, [2])


async def test_a_run_of_another_config_version_waits_for_its_own_first(store: MemoryStore) -> None:
    await store.create_durable_run(durable("v1-run", config_version="v1"), owner="dead", lease_seconds=TINY)
    await store.create_durable_run(durable("plain", config_version=""), owner="dead", lease_seconds=TINY)
    for _ in range(400):  # until both leases expired on the database's clock
        if len(await store.unclaimable_durable_runs(agents=["nothing"], limit=10)) == 2:
            break
        await asyncio.sleep(0.01)
    # a replica of v2: the run without a version at once, v1's not within a long grace
    got = await store.claim_expired_durable_runs(
        owner="v2", lease_seconds=LONG, limit=10, versions=["v2"], other_versions_after=LONG
    )
    assert [r.run_id for r in got] == ["plain"]
    # a replica of v1 takes it at once; had none come, v2 takes it once the grace is over
    await store.create_durable_run(durable("v1-late", config_version="v1"), owner="dead", lease_seconds=TINY)
    [mine] = await store.claim_expired_durable_runs(owner="v1", lease_seconds=LONG, limit=1, versions=["v1"])
    assert mine.run_id == "v1-run"
    late = []
    for _ in range(400):
        late += await store.claim_expired_durable_runs(
            owner="v2", lease_seconds=LONG, limit=10, versions=["v2"], other_versions_after=TINY
        )
        if late:
            break
        await asyncio.sleep(0.01)
    assert [(r.run_id, r.config_version, r.owner) for r in late] == [("v1-late", "v1", "v2")]
