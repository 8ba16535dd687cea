"""Suspended runs in the MemoryStore contract, on both backends: saved, claimed by exactly one
approval (in any process), released, deleted, listed; the schema upgrade that brings them."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest

from procmesh_orchestrator.errors import (
    InvalidMemoryInputError,
    ResumeConflictError,
    SuspendedRunNotFoundError,
)
from procmesh_orchestrator.store import MemoryStore, SuspendedRun
from tests.integration.memory.conftest import Backend
from tests.integration.memory.test_store_contract import ids, msg
from tests.integration.memory.test_thread_scoping import save_unscoped

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# What a run's messages may hold (NUL, a lone surrogate): the reason snapshots are not jsonb.
AWKWARD = 'nul\x00 surrogate \ud800 emoji \U0001f600 quote"back\\slash'


def run(run_id: str = "r1", **changes: Any) -> SuspendedRun:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "agent_id": "agent",
        "thread_id": "t1",
        "resource_id": "alice",
        "tool_call_ids": ("call-1", "call-2"),
        "snapshot": {"step": 3, "messages": [msg("u1", text=AWKWARD)], "usage": {"n": 1.5, "z": None}},
    }
    return SuspendedRun(**{**fields, **changes})


def run_ids(runs: list[SuspendedRun]) -> list[str]:
    return [r.run_id for r in runs]


async def listed(store: MemoryStore, **filters: Any) -> tuple[list[str], int]:
    runs, total = await store.list_suspended("agent", **filters)
    return run_ids(runs), total


# --- save, claim, release, delete ----------------------------------------------------------------


async def test_a_saved_run_is_claimed_whole_and_marked_resuming(store: MemoryStore) -> None:
    saved = run()
    await store.save_suspended(saved)
    claimed = await store.claim_suspended("r1", "call-2")
    assert claimed.status == "resuming"
    assert ISO.match(claimed.created_at)
    assert claimed == SuspendedRun(
        **{**saved.__dict__, "created_at": claimed.created_at, "status": "resuming"}
    )
    assert isinstance(claimed.tool_call_ids, tuple)
    runs, total = await store.list_suspended("agent")
    assert (runs, total) == ([claimed], 1)


async def test_a_second_claim_is_a_conflict_whichever_call_it_approves(store: MemoryStore) -> None:
    await store.save_suspended(run())
    await store.claim_suspended("r1", "call-1")
    for call in ("call-1", "call-2"):
        with pytest.raises(ResumeConflictError, match="suspended run 'r1' is already being resumed"):
            await store.claim_suspended("r1", call)


async def test_a_finished_run_keeps_its_id_so_a_late_decision_is_a_conflict(store: MemoryStore) -> None:
    await store.save_suspended(run())
    await store.claim_suspended("r1", "call-1")
    await store.finish_suspended("r1")
    with pytest.raises(ResumeConflictError, match="suspended run 'r1' was already resumed"):
        await store.claim_suspended("r1", "call-1")
    assert await listed(store) == ([], 0)  # no longer waiting, no longer listed
    await store.release_suspended("r1")  # a release touches only a claimed run
    with pytest.raises(ResumeConflictError):
        await store.claim_suspended("r1", "call-1")


async def test_an_unknown_run_or_tool_call_is_not_found(store: MemoryStore, backend: Backend) -> None:
    with pytest.raises(
        SuspendedRunNotFoundError, match=f"memory store {backend.name}.*no suspended run 'r1'"
    ):
        await store.claim_suspended("r1", "call-1")
    await store.save_suspended(run())
    with pytest.raises(SuspendedRunNotFoundError, match="'r1' awaits no tool call 'call-9'"):
        await store.claim_suspended("r1", "call-9")
    await store.claim_suspended("r1", "call-1")  # the failed claims took nothing
    with pytest.raises(SuspendedRunNotFoundError, match="awaits no tool call 'call-9'"):
        await store.claim_suspended("r1", "call-9")  # claimed or not, an unknown call is unknown


async def test_a_claim_without_a_call_takes_the_run_s_only_awaited_call(store: MemoryStore) -> None:
    await store.save_suspended(run())
    with pytest.raises(InvalidMemoryInputError, match=r"awaits 2 tool calls \(call-1, call-2\): name one"):
        await store.claim_suspended("r1", None)
    await store.save_suspended(run(tool_call_ids=("call-2",)))  # the failed claim took nothing
    assert (await store.claim_suspended("r1", None)).tool_call_ids == ("call-2",)
    with pytest.raises(ResumeConflictError):
        await store.claim_suspended("r1", None)


async def test_a_released_run_can_be_claimed_again(store: MemoryStore) -> None:
    await store.save_suspended(run())
    await store.release_suspended("r1")  # not claimed: nothing to do
    await store.claim_suspended("r1", "call-1")
    await store.release_suspended("r1")
    assert (await store.list_suspended("agent"))[0][0].status == "suspended"
    again = await store.claim_suspended("r1", "call-2")
    assert again.status == "resuming"
    await store.release_suspended("ghost")  # no such run: no error


async def test_a_deleted_run_is_gone(store: MemoryStore) -> None:
    await store.save_suspended(run())
    await store.save_suspended(run("r2"))
    await store.claim_suspended("r1", "call-1")
    await store.delete_suspended("r1")
    with pytest.raises(SuspendedRunNotFoundError):
        await store.claim_suspended("r1", "call-1")
    assert await listed(store) == (["r2"], 1)
    await store.delete_suspended("r1")  # deleting again is no error


async def test_saving_again_replaces_the_run_and_suspends_it_anew(store: MemoryStore) -> None:
    await store.save_suspended(run())
    first = await store.claim_suspended("r1", "call-1")
    await asyncio.sleep(0.002)
    await store.save_suspended(run(tool_call_ids=("call-3",), snapshot={"step": 4}, thread_id=""))
    [stored], total = await store.list_suspended("agent")
    assert total == 1
    assert (stored.status, stored.tool_call_ids, stored.snapshot, stored.thread_id) == (
        "suspended",
        ("call-3",),
        {"step": 4},
        "",
    )
    assert stored.created_at > first.created_at
    with pytest.raises(SuspendedRunNotFoundError):
        await store.claim_suspended("r1", "call-1")  # the old calls no longer await anything
    assert (await store.claim_suspended("r1", "call-3")).snapshot == {"step": 4}


async def test_a_snapshot_of_megabytes_round_trips(store: MemoryStore) -> None:
    big = {"messages": [msg(f"m{i}", text="x" * 10_000 + AWKWARD) for i in range(600)]}  # ~6 MB
    await store.save_suspended(run(snapshot=big))
    assert (await store.claim_suspended("r1", "call-1")).snapshot == big


# --- listing ------------------------------------------------------------------------------------


async def test_list_filters_by_agent_thread_and_resource_newest_first(store: MemoryStore) -> None:
    await store.save_suspended(run("a", thread_id="t1", resource_id="alice"))
    await store.save_suspended(run("b", thread_id="t2", resource_id="alice"))
    await store.save_suspended(run("c", thread_id="", resource_id=""))
    await store.save_suspended(run("d", thread_id="t1", resource_id="bob"))
    await store.save_suspended(run("other", agent_id="agent-2"))
    assert await listed(store) == (["d", "c", "b", "a"], 4)
    assert await listed(store, thread_id="t1") == (["d", "a"], 2)
    assert await listed(store, resource_id="alice") == (["b", "a"], 2)
    assert await listed(store, thread_id="t1", resource_id="bob") == (["d"], 1)
    assert await listed(store, thread_id="") == (["c"], 1)  # "" selects the runs without a thread
    assert await listed(store, resource_id="nobody") == ([], 0)
    assert run_ids((await store.list_suspended("agent-2"))[0]) == ["other"]
    assert await store.list_suspended("no-agent") == ([], 0)


async def test_list_pages_count_everything_that_matches(store: MemoryStore) -> None:
    for n in range(7):
        await store.save_suspended(run(f"r{n}"))
    assert await listed(store, per_page=3) == (["r6", "r5", "r4"], 7)
    assert await listed(store, page=1, per_page=3) == (["r3", "r2", "r1"], 7)
    assert await listed(store, page=2, per_page=3) == (["r0"], 7)
    assert await listed(store, page=3, per_page=3) == ([], 7)  # past the end: no runs, still the total
    assert await listed(store, page=50, per_page=1) == ([], 7)


async def test_list_date_bounds_are_inclusive_at_the_reported_time(store: MemoryStore) -> None:
    for name in ("r1", "r2", "r3"):
        await store.save_suspended(run(name))
        await asyncio.sleep(0.003)  # distinct milliseconds
    runs, _ = await store.list_suspended("agent")
    at = {r.run_id: r.created_at for r in runs}
    assert await listed(store, from_date=at["r2"]) == (["r3", "r2"], 2)
    assert await listed(store, to_date=at["r2"]) == (["r2", "r1"], 2)
    assert await listed(store, from_date=at["r2"], to_date=at["r2"]) == (["r2"], 1)
    assert await listed(store, from_date="2000-01-01") == (["r3", "r2", "r1"], 3)
    assert await listed(store, to_date="2000-01-01T00:00:00+02:00") == ([], 0)
    naive = at["r3"].removesuffix("Z")  # no offset: UTC
    assert await listed(store, from_date=naive) == (["r3"], 1)


# --- malformed input ------------------------------------------------------------------------------


class NotJson:
    pass


@pytest.mark.parametrize(
    "snapshot",
    [{"x": NotJson()}, {"x": {1, 2}}, {"x": float("nan")}, {1j: "key"}],
    ids=["object", "set", "nan", "complex-key"],
)
async def test_a_snapshot_that_is_not_json_is_refused_and_writes_nothing(
    store: MemoryStore, snapshot: dict[Any, Any]
) -> None:
    with pytest.raises(InvalidMemoryInputError, match="suspended run 'r1': the snapshot is not JSON"):
        await store.save_suspended(run(snapshot=snapshot))
    assert await listed(store) == ([], 0)
    await store.save_suspended(run())
    with pytest.raises(InvalidMemoryInputError, match="is not JSON"):
        await store.save_suspended(run(snapshot=snapshot))  # a bad replacement keeps the old run
    assert (await store.claim_suspended("r1", "call-1")).snapshot == run().snapshot


async def test_an_oversized_snapshot_is_refused(backend: Backend) -> None:
    store = backend.open(max_snapshot_bytes=10_000)
    await store.start()
    try:
        with pytest.raises(
            InvalidMemoryInputError, match=r"the snapshot is \d+ bytes as JSON, more than the 10000"
        ):
            await store.save_suspended(run(snapshot={"x": "y" * 20_000}))
        assert await listed(store) == ([], 0)
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("bad", "pattern"),
    [
        ({"run_id": ""}, "run id '' must not be empty"),
        ({"agent_id": None}, "agent id None must be a string"),
        ({"thread_id": "a\nb"}, "thread id .* contains control"),
        ({"resource_id": 7}, "resource id 7 must be a string"),
        ({"tool_call_ids": ()}, "tool_call_ids must be a tuple of 1 to"),
        ({"tool_call_ids": "call-1"}, "tool_call_ids must be a tuple"),
        ({"tool_call_ids": ("ok", "")}, "tool call id '' must not be empty"),
        ({"snapshot": ["not", "an", "object"]}, "the snapshot must be an object, not list"),
    ],
)
async def test_malformed_runs_are_refused(store: MemoryStore, bad: dict[str, Any], pattern: str) -> None:
    with pytest.raises(InvalidMemoryInputError, match=pattern):
        await store.save_suspended(run(**bad))
    assert await listed(store) == ([], 0)


@pytest.mark.parametrize(
    ("call", "pattern"),
    [
        (lambda s: s.save_suspended({"run_id": "r1"}), "a suspended run is a SuspendedRun, not dict"),
        (lambda s: s.claim_suspended("", "call-1"), "run id '' must not be empty"),
        (lambda s: s.claim_suspended("r1", 7), "tool call id 7 must be a string"),
        (lambda s: s.release_suspended("x" * 10_000), "run id .* more than the 256 allowed"),
        (lambda s: s.delete_suspended(3), "run id 3 must be a string"),
        (lambda s: s.list_suspended(""), "agent id '' must not be empty"),
        (lambda s: s.list_suspended("agent", thread_id="\x00"), "thread id .* contains control"),
        (lambda s: s.list_suspended("agent", from_date="yesterday"), "from_date must be an ISO 8601"),
        (lambda s: s.list_suspended("agent", to_date=20260101), "to_date must be an ISO 8601"),
        (lambda s: s.list_suspended("agent", page=-1), "page must be an integer from 0"),
        (lambda s: s.list_suspended("agent", per_page=0), "per_page must be an integer from 1"),
        (lambda s: s.list_suspended("agent", per_page=True), "per_page must be an integer"),
    ],
)
async def test_malformed_arguments_are_refused(store: MemoryStore, call: Any, pattern: str) -> None:
    with pytest.raises(InvalidMemoryInputError, match=pattern):
        await call(store)


# --- concurrency and the schema upgrade ------------------------------------------------------------


async def test_of_concurrent_claims_from_two_stores_exactly_one_wins(backend: Backend) -> None:
    first, second = backend.open(), backend.open()  # two processes' stores on one database
    await first.start()
    await second.start()
    try:
        for n in range(5):
            await first.save_suspended(run(f"r{n}"))
        results = await asyncio.gather(
            *(
                s.claim_suspended(f"r{n}", f"call-{1 + i % 2}")
                for n in range(5)
                for i in range(8)
                for s in (first, second)
            ),
            return_exceptions=True,
        )
        for n in range(5):
            mine = results[n * 16 : (n + 1) * 16]
            won = [r for r in mine if isinstance(r, SuspendedRun)]
            assert len(won) == 1, mine
            assert won[0].run_id == f"r{n}"
            assert all(isinstance(r, ResumeConflictError) for r in mine if r is not won[0]), mine
        runs, total = await second.list_suspended("agent")
        assert total == 5
        assert {r.status for r in runs} == {"resuming"}
    finally:
        await first.close()
        await second.close()


async def test_a_version_1_database_upgrades_in_place(
    backend: Backend, schema_at: Callable[[int | None], None]
) -> None:
    schema_at(1)
    old = backend.open()
    await old.start()
    save_unscoped(backend, "t1", "alice", [msg("u1"), msg("a1", "assistant")])  # as version 1 did
    await old.close()
    assert backend.schema_versions() == [1]

    schema_at(None)
    new = backend.open()
    await new.start()
    try:
        assert backend.schema_versions() == backend.latest_versions()
        assert ids(await new.messages("t1", "alice")) == ["u1", "a1"]  # the old data is still there
        await new.save_suspended(run())
        assert (await new.claim_suspended("r1", "call-1")).status == "resuming"
    finally:
        await new.close()
