"""Durable runs in the MemoryStore contract, on both backends: created under a lease, checkpointed
and renewed by their owner only, claimed once their lease expired (by exactly one of two racing
stores), cancelled, finished, listed without snapshots; the schema upgrade that brings them."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from procmesh_orchestrator.errors import (
    DurableRunExistsError,
    DurableRunNotFoundError,
    FencedWriteError,
    InvalidMemoryInputError,
    LeaseLostError,
)
from procmesh_orchestrator.store import DurableRun, MemoryStore
from tests.integration.memory.conftest import Backend
from tests.integration.memory.test_store_contract import ids, msg
from tests.integration.memory.test_suspended_runs import AWKWARD, NotJson
from tests.integration.memory.test_suspended_runs import run as suspended
from tests.integration.memory.test_thread_scoping import save_unscoped

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
LONG = 60.0
"""A lease that does not expire during a test."""
TINY = 0.05
"""A lease that expires while the test polls for it."""


def durable(run_id: str = "r1", **changes: Any) -> DurableRun:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "agent_id": "agent",
        "thread_id": "t1",
        "resource_id": "alice",
        "snapshot": {"step": 0, "messages": [msg("u1", text=AWKWARD)]},
    }
    return DurableRun(**{**fields, **changes})


async def create(store: MemoryStore, run_id: str = "r1", owner: str = "a", **changes: Any) -> DurableRun:
    return await store.create_durable_run(durable(run_id, **changes), owner=owner, lease_seconds=LONG)


async def claim_eventually(store: MemoryStore, owner: str, want: int = 1) -> list[DurableRun]:
    """Claim until `want` runs came back (their leases expire on the database's clock)."""
    claimed: list[DurableRun] = []
    for _ in range(400):
        claimed += await store.claim_expired_durable_runs(owner=owner, lease_seconds=LONG, limit=want)
        if len(claimed) >= want:
            return claimed
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {len(claimed)} of {want} expired runs were claimed")


async def stored(store: MemoryStore, run_id: str = "r1") -> DurableRun:
    run = await store.get_durable_run(run_id)
    assert run is not None
    return run


# --- create, checkpoint, renew, finish ---------------------------------------------------------------


async def test_a_created_run_is_running_and_held_by_its_owner(store: MemoryStore) -> None:
    created = await create(store)
    assert (created.status, created.owner, created.attempts, created.cancel_requested) == (
        "running",
        "a",
        1,
        False,
    )
    assert created.snapshot == durable().snapshot
    for moment in (created.created_at, created.updated_at, created.lease_expires_at):
        assert ISO.match(moment), moment
    assert created.lease_expires_at > created.created_at
    assert await stored(store) == created
    assert await store.get_durable_run("ghost") is None


async def test_an_existing_run_id_is_refused(store: MemoryStore) -> None:
    await create(store)
    with pytest.raises(DurableRunExistsError, match="a durable run 'r1' exists already"):
        await create(store, owner="b", snapshot={"other": True})
    assert (await stored(store)).owner == "a"
    assert (await stored(store)).snapshot == durable().snapshot


async def test_checkpoints_replace_the_snapshot_and_renew_the_lease(store: MemoryStore) -> None:
    created = await create(store)
    await asyncio.sleep(0.003)
    await store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot={"step": 1}, lease_seconds=LONG)
    await store.checkpoint_durable_run(
        "r1", owner="a", epoch=1, snapshot={"step": 2, "x": AWKWARD}, lease_seconds=LONG
    )
    run = await stored(store)
    assert run.snapshot == {"step": 2, "x": AWKWARD}
    assert run.updated_at > created.updated_at
    assert run.lease_expires_at > created.lease_expires_at
    assert (run.status, run.owner, run.attempts, run.created_at) == ("running", "a", 1, created.created_at)


async def test_a_renewal_extends_the_lease_and_reports_no_cancel(store: MemoryStore) -> None:
    created = await create(store)
    await asyncio.sleep(0.003)
    assert await store.renew_durable_lease("r1", owner="a", epoch=1, lease_seconds=LONG) is False
    run = await stored(store)
    assert run.lease_expires_at > created.lease_expires_at
    assert run.snapshot == created.snapshot


@pytest.mark.parametrize("status", ["done", "failed", "cancelled"])
async def test_a_finished_run_drops_its_snapshot_and_keeps_its_row(store: MemoryStore, status: str) -> None:
    await create(store)
    await store.finish_durable_run(
        "r1", owner="a", epoch=1, status=status, error="boom" if status == "failed" else ""
    )
    run = await stored(store)
    assert (run.status, run.snapshot, run.owner, run.lease_expires_at) == (status, {}, "", "")
    assert run.error == ("boom" if status == "failed" else "")
    with pytest.raises(LeaseLostError, match=f"durable run 'r1' is {status}, no longer running"):
        await store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot={"late": 1}, lease_seconds=LONG)
    with pytest.raises(LeaseLostError):
        await store.renew_durable_lease("r1", owner="a", epoch=1, lease_seconds=LONG)
    with pytest.raises(LeaseLostError):
        await store.finish_durable_run("r1", owner="a", epoch=1, status="done")
    assert (await stored(store)).snapshot == {}


async def test_a_suspended_run_keeps_its_snapshot(store: MemoryStore) -> None:
    await create(store)
    await store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot={"step": 5}, lease_seconds=LONG)
    await store.finish_durable_run("r1", owner="a", epoch=1, status="suspended")
    run = await stored(store)
    assert (run.status, run.snapshot, run.owner) == ("suspended", {"step": 5}, "")
    assert await store.claim_expired_durable_runs(owner="b", lease_seconds=LONG, limit=10) == []


async def test_a_failed_runs_error_is_cut_short_and_made_storable(store: MemoryStore) -> None:
    await create(store)
    await store.finish_durable_run(
        "r1", owner="a", epoch=1, status="failed", error="\x00\ud800" + "e" * 100_000
    )
    error = (await stored(store)).error
    assert len(error) == 16_384
    assert error.startswith("\ufffd?e")


# --- leases: a non-owner, an expired lease, a claim --------------------------------------------------


async def test_a_non_owner_writes_nothing(store: MemoryStore) -> None:
    created = await create(store)
    with pytest.raises(LeaseLostError, match="durable run 'r1' is held by another owner than 'b'"):
        await store.checkpoint_durable_run("r1", owner="b", epoch=1, snapshot={"evil": 1}, lease_seconds=LONG)
    with pytest.raises(LeaseLostError):
        await store.renew_durable_lease("r1", owner="b", epoch=1, lease_seconds=LONG)
    with pytest.raises(LeaseLostError):
        await store.finish_durable_run("r1", owner="b", epoch=1, status="done")
    assert await stored(store) == created


async def test_writes_to_an_unknown_run_are_not_found(store: MemoryStore) -> None:
    with pytest.raises(DurableRunNotFoundError, match="no durable run 'ghost'"):
        await store.checkpoint_durable_run("ghost", owner="a", epoch=1, snapshot={}, lease_seconds=LONG)
    with pytest.raises(DurableRunNotFoundError):
        await store.renew_durable_lease("ghost", owner="a", epoch=1, lease_seconds=LONG)
    with pytest.raises(DurableRunNotFoundError):
        await store.finish_durable_run("ghost", owner="a", epoch=1, status="done")
    with pytest.raises(DurableRunNotFoundError):
        await store.request_durable_cancel("ghost")


async def test_an_expired_lease_is_claimed_by_another_owner_who_then_holds_the_run(
    store: MemoryStore,
) -> None:
    await store.create_durable_run(durable(), owner="a", lease_seconds=TINY)
    await store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot={"step": 1}, lease_seconds=TINY)
    await create(store, "r2", owner="a")  # a long lease: never claimed here
    [claimed] = await claim_eventually(store, "b")
    assert (claimed.run_id, claimed.owner, claimed.attempts, claimed.status) == ("r1", "b", 2, "running")
    assert claimed.epoch == 2  # one more at each claim: the fencing token
    assert claimed.snapshot == {"step": 1}  # the last checkpoint, to continue from
    assert await store.claim_expired_durable_runs(owner="c", lease_seconds=LONG, limit=10) == []

    await store.checkpoint_durable_run("r1", owner="b", epoch=2, snapshot={"step": 2}, lease_seconds=LONG)
    with pytest.raises(FencedWriteError, match="under epoch 1 refused: the run is at epoch 2") as refused:
        await store.checkpoint_durable_run(
            "r1", owner="a", epoch=1, snapshot={"step": 99}, lease_seconds=LONG
        )
    assert (refused.value.epoch, refused.value.current) == (1, 2)
    with pytest.raises(LeaseLostError):
        await store.renew_durable_lease("r1", owner="a", epoch=1, lease_seconds=LONG)
    assert await store.renew_durable_lease("r1", owner="b", epoch=2, lease_seconds=LONG) is False
    assert (await stored(store)).snapshot == {"step": 2}
    await store.finish_durable_run("r1", owner="b", epoch=2, status="done")
    assert ((await stored(store)).status, (await stored(store, "r2")).owner) == ("done", "a")


async def test_an_expired_lease_nobody_claimed_is_still_held(store: MemoryStore) -> None:
    short = await store.create_durable_run(durable(), owner="a", lease_seconds=TINY)
    await create(store, "clock")
    for _ in range(400):  # until the database's clock is past r1's lease
        await store.checkpoint_durable_run("clock", owner="a", epoch=1, snapshot={}, lease_seconds=LONG)
        if (await stored(store, "clock")).updated_at > short.lease_expires_at:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the lease did not expire")
    await store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot={"step": 1}, lease_seconds=LONG)
    run = await stored(store)
    assert (run.owner, run.snapshot, run.attempts) == ("a", {"step": 1}, 1)
    assert await store.claim_expired_durable_runs(owner="b", lease_seconds=LONG, limit=10) == []


async def test_claims_take_the_oldest_leases_first_up_to_the_limit(store: MemoryStore) -> None:
    for n in range(5):
        await store.create_durable_run(durable(f"r{n}"), owner="a", lease_seconds=TINY)
        await asyncio.sleep(0.003)  # distinct lease ends
    batches: list[list[str]] = []
    for _ in range(400):
        got = await store.claim_expired_durable_runs(owner="b", lease_seconds=LONG, limit=2)
        if got:
            batches.append([r.run_id for r in got])
        if sum(map(len, batches)) == 5:
            break
        await asyncio.sleep(0.01)
    assert all(1 <= len(batch) <= 2 for batch in batches), batches
    assert [run_id for batch in batches for run_id in batch] == [f"r{n}" for n in range(5)]


async def test_two_stores_racing_claim_each_expired_run_exactly_once(backend: Backend) -> None:
    first, second = backend.open(), backend.open()  # two replicas' pools (two SQLite connections)
    await first.start()
    await second.start()
    try:
        for n in range(100):
            await first.create_durable_run(durable(f"r{n:03}"), owner="dead", lease_seconds=TINY)
        claims: dict[str, list[str]] = {}

        async def replica(store: MemoryStore, owner: str) -> None:
            for _ in range(2000):
                if sum(map(len, claims.values())) >= 100:
                    return
                got = await store.claim_expired_durable_runs(owner=owner, lease_seconds=LONG, limit=7)
                for run in got:
                    claims.setdefault(run.run_id, []).append(owner)
                    assert run.attempts == 2
                await asyncio.sleep(0 if got else 0.005)

        await asyncio.gather(
            *(
                replica(store, f"{name}-{k}")
                for name, store in (("p", first), ("q", second))
                for k in range(3)
            )
        )
        assert sorted(claims) == [f"r{n:03}" for n in range(100)]
        assert all(len(owners) == 1 for owners in claims.values()), claims
        runs, total = await first.list_durable_runs(per_page=100)
        assert total == 100
        assert {r.run_id: r.owner for r in runs} == {run_id: owners[0] for run_id, owners in claims.items()}
        assert {r.attempts for r in runs} == {2}
    finally:
        await first.close()
        await second.close()


# --- cancel and listing ----------------------------------------------------------------------------


async def test_a_cancel_request_is_seen_by_the_next_renewal(store: MemoryStore) -> None:
    await create(store)
    cancelled = await store.request_durable_cancel("r1")
    assert (cancelled.cancel_requested, cancelled.status, cancelled.snapshot) == (True, "running", {})
    assert await store.renew_durable_lease("r1", owner="a", epoch=1, lease_seconds=LONG) is True
    await store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot={"step": 1}, lease_seconds=LONG)
    assert (await stored(store)).cancel_requested is True  # stays until the run ends
    await store.finish_durable_run("r1", owner="a", epoch=1, status="cancelled")
    assert (await stored(store)).status == "cancelled"


async def test_a_cancel_request_leaves_an_ended_run_as_it_ended(store: MemoryStore) -> None:
    await create(store)
    await store.finish_durable_run("r1", owner="a", epoch=1, status="done")
    assert (await store.request_durable_cancel("r1")).cancel_requested is False
    await create(store, "r2")
    await store.finish_durable_run("r2", owner="a", epoch=1, status="suspended")
    assert (await store.request_durable_cancel("r2")).cancel_requested is True


async def listed(store: MemoryStore, **filters: Any) -> tuple[list[str], int]:
    runs, total = await store.list_durable_runs(**filters)
    assert all(r.snapshot == {} for r in runs)  # listings never carry snapshots
    return [r.run_id for r in runs], total


async def test_list_filters_newest_first_without_snapshots(store: MemoryStore) -> None:
    await create(store, "a", resource_id="alice")
    await create(store, "b", resource_id="bob", agent_id="agent-2")
    await create(store, "c", resource_id="")
    await create(store, "d", resource_id="alice")
    await store.finish_durable_run("d", owner="a", epoch=1, status="failed", error="x")
    assert await listed(store) == (["d", "c", "b", "a"], 4)
    assert await listed(store, resource_id="alice") == (["d", "a"], 2)
    assert await listed(store, resource_id="") == (["c"], 1)
    assert await listed(store, agent_id="agent-2") == (["b"], 1)
    assert await listed(store, status="running") == (["c", "b", "a"], 3)
    assert await listed(store, status="failed", resource_id="alice") == (["d"], 1)
    assert await listed(store, status="done") == ([], 0)
    runs, _ = await store.list_durable_runs(status="failed")
    assert (runs[0].error, runs[0].owner, runs[0].attempts) == ("x", "", 1)
    [a] = (await store.list_durable_runs(resource_id="alice", status="running"))[0]
    assert a == replace(await stored(store, "a"), snapshot={})


async def test_list_pages_count_everything_that_matches(store: MemoryStore) -> None:
    for n in range(7):
        await create(store, f"r{n}")
    assert await listed(store, per_page=3) == (["r6", "r5", "r4"], 7)
    assert await listed(store, page=1, per_page=3) == (["r3", "r2", "r1"], 7)
    assert await listed(store, page=2, per_page=3) == (["r0"], 7)
    assert await listed(store, page=3, per_page=3) == ([], 7)


async def test_a_snapshot_of_megabytes_round_trips(store: MemoryStore) -> None:
    big = {"messages": [msg(f"m{i}", text="x" * 10_000 + AWKWARD) for i in range(600)]}  # ~6 MB
    await create(store)
    await store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot=big, lease_seconds=LONG)
    assert (await stored(store)).snapshot == big


# --- malformed input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "snapshot",
    [{"x": NotJson()}, {"x": {1, 2}}, {"x": float("nan")}, {1j: "key"}, ["list"]],
    ids=["object", "set", "nan", "complex-key", "not-an-object"],
)
async def test_a_snapshot_that_is_not_json_is_refused_and_writes_nothing(
    store: MemoryStore, snapshot: Any
) -> None:
    with pytest.raises(InvalidMemoryInputError, match="durable run 'r1': the snapshot"):
        await store.create_durable_run(durable(snapshot=snapshot), owner="a", lease_seconds=LONG)
    assert await store.get_durable_run("r1") is None
    created = await create(store)
    with pytest.raises(InvalidMemoryInputError, match="durable run 'r1': the snapshot"):
        await store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot=snapshot, lease_seconds=LONG)
    assert await stored(store) == created


async def test_an_oversized_snapshot_is_refused(backend: Backend) -> None:
    store = backend.open(max_snapshot_bytes=10_000)
    await store.start()
    try:
        big = {"x": "y" * 20_000}
        pattern = r"the snapshot is \d+ bytes as JSON, more than the 10000"
        with pytest.raises(InvalidMemoryInputError, match=pattern):
            await store.create_durable_run(durable(snapshot=big), owner="a", lease_seconds=LONG)
        created = await create(store)
        with pytest.raises(InvalidMemoryInputError, match=pattern):
            await store.checkpoint_durable_run("r1", owner="a", epoch=1, snapshot=big, lease_seconds=LONG)
        assert await stored(store) == created
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ({"run_id": ""}, "run id '' must not be empty"),
        ({"run_id": "x" * 300}, "run id .* more than the 256 allowed"),
        ({"agent_id": None}, "agent id None must be a string"),
        ({"thread_id": "a\nb"}, "thread id .* contains control"),
        ({"resource_id": 7}, "resource id 7 must be a string"),
    ],
)
async def test_malformed_runs_are_refused(store: MemoryStore, bad: dict[str, Any], pattern: str) -> None:
    with pytest.raises(InvalidMemoryInputError, match=pattern):
        await store.create_durable_run(durable(**bad), owner="a", lease_seconds=LONG)
    assert await listed(store) == ([], 0)


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (
            lambda s: s.create_durable_run({"run_id": "r2"}, owner="a", lease_seconds=1),
            "a durable run is a DurableRun, not dict",
        ),
        (lambda s: s.create_durable_run(durable("r2"), owner="", lease_seconds=1), "owner id '' must not"),
        (lambda s: s.create_durable_run(durable("r2"), owner="a", lease_seconds=0), "lease_seconds must"),
        (
            lambda s: s.checkpoint_durable_run(
                "r1", owner="a", epoch=1, snapshot={}, lease_seconds=float("inf")
            ),
            "lease_seconds must be a number above 0",
        ),
        (lambda s: s.renew_durable_lease("r1", owner="a", epoch=1, lease_seconds=True), "lease_seconds must"),
        (lambda s: s.renew_durable_lease("r1", owner="a", epoch=1, lease_seconds="5"), "lease_seconds must"),
        (
            lambda s: s.renew_durable_lease("r1", owner="a", epoch=0, lease_seconds=1),
            "epoch must be an integer",
        ),
        (
            lambda s: s.finish_durable_run("r1", owner="a", epoch=True, status="done"),
            "epoch must be an integer",
        ),
        (
            lambda s: s.renew_durable_lease("r1", owner=None, epoch=1, lease_seconds=1),
            "owner id None must be",
        ),
        (
            lambda s: s.checkpoint_durable_run("", owner="a", epoch=1, snapshot={}, lease_seconds=1),
            "run id ''",
        ),
        (lambda s: s.finish_durable_run("r1", owner="a", epoch=1, status="running"), "status is one of done"),
        (lambda s: s.finish_durable_run("r1", owner="a", epoch=1, status="DONE"), "status is one of done"),
        (lambda s: s.finish_durable_run("r1", owner="a", epoch=1, status="failed", error=3), "error must be"),
        (lambda s: s.finish_durable_run("r1", owner="a\x00", epoch=1, status="done"), "owner id .* contains"),
        (lambda s: s.request_durable_cancel(5), "run id 5 must be a string"),
        (lambda s: s.get_durable_run("a\tb"), "run id .* contains control"),
        (
            lambda s: s.claim_expired_durable_runs(owner="b", lease_seconds=1, limit=0),
            "limit must be an integer from 1 to 1000",
        ),
        (
            lambda s: s.claim_expired_durable_runs(owner="b", lease_seconds=-1, limit=1),
            "lease_seconds must",
        ),
        (lambda s: s.list_durable_runs(status="resuming"), "status is one of running"),
        (lambda s: s.list_durable_runs(agent_id=""), "agent id '' must not be empty"),
        (lambda s: s.list_durable_runs(per_page=0), "per_page must be an integer from 1"),
        (lambda s: s.list_durable_runs(page=-1), "page must be an integer from 0"),
    ],
)
async def test_malformed_arguments_are_refused_and_write_nothing(
    store: MemoryStore, call: Any, pattern: str
) -> None:
    created = await create(store)
    with pytest.raises(InvalidMemoryInputError, match=pattern):
        await call(store)
    assert await stored(store) == created
    assert await listed(store) == (["r1"], 1)


# --- the schema upgrade ------------------------------------------------------------------------------


async def test_a_version_2_database_upgrades_in_place(
    backend: Backend, schema_at: Callable[[int | None], None]
) -> None:
    schema_at(2)
    old = backend.open()
    await old.start()
    save_unscoped(backend, "t1", "alice", [msg("u1")])  # as version 2 did
    await old.save_suspended(suspended())
    await old.close()
    assert backend.schema_versions() == [1, 2]

    schema_at(None)
    new = backend.open()
    await new.start()
    try:
        assert backend.schema_versions() == backend.latest_versions()
        assert ids(await new.messages("t1", "alice")) == ["u1"]  # the old data is still there
        assert (await new.claim_suspended("r1", "call-1")).snapshot == suspended().snapshot
        created = await create(new)
        assert await stored(new) == created
    finally:
        await new.close()
