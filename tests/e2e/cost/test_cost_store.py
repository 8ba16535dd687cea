"""The cost ledger of both stores, really written: SQLite and PostgreSQL give the same answers to
reservations, settlements and releases, and refuse bad input before anything is written."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from procmesh_orchestrator.errors import InvalidMemoryInputError
from procmesh_orchestrator.store import MemoryStore, open_store
from tests.e2e.memory.test_store_safety import postgres_dsn
from tests.integration.memory.pg import fresh_dsn

pytestmark = pytest.mark.e2e

__all__ = ["postgres_dsn"]  # the module's PostgreSQL server (tests/e2e/memory)

DAY = 86400.0


@pytest_asyncio.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryStore]:
    if request.param == "sqlite":
        opened = open_store({"backend": "sqlite", "path": str(tmp_path / "memory.db")})
    else:
        dsn = fresh_dsn(request.getfixturevalue("postgres_dsn"))
        opened = open_store({"backend": "postgres", "dsn": dsn})
    await opened.start()
    yield opened
    await opened.close()


async def test_a_scope_admits_calls_until_it_spent_its_limit(store: MemoryStore) -> None:
    first = await store.reserve_cost("resource:ada", "r1", 60, limit=100, window_seconds=DAY)
    second = await store.reserve_cost("resource:ada", "r2", 60, limit=100, window_seconds=DAY)
    third = await store.reserve_cost("resource:ada", "r3", 60, limit=100, window_seconds=DAY)
    assert [(a.admitted, a.spent) for a in (first, second, third)] == [(True, 0), (True, 60), (False, 120)]
    assert await store.spent_cost("resource:ada", window_seconds=DAY) == 120, "a refused call holds nothing"
    await store.settle_cost("r1", 10)  # the call cost less than its estimate
    await store.release_cost("r2")  # the call was rejected
    await store.release_cost("r1")  # a settled call stays
    assert await store.spent_cost("resource:ada", window_seconds=DAY) == 10
    assert (await store.reserve_cost("resource:ada", "r4", 60, limit=100, window_seconds=DAY)).admitted
    assert await store.spent_cost("resource:bob", window_seconds=DAY) == 0, "scopes are apart"


async def test_warn_mode_holds_the_amount_past_the_limit(store: MemoryStore) -> None:
    await store.reserve_cost("global", "w1", 100, limit=100, window_seconds=DAY)
    held = await store.reserve_cost("global", "w2", 100, limit=100, window_seconds=DAY, enforce=False)
    assert (held.admitted, held.spent) == (False, 100)
    assert await store.spent_cost("global", window_seconds=DAY) == 200


@pytest.mark.parametrize(
    ("scope", "reservation", "amount", "limit", "window", "problem"),
    [
        ("", "r", 1, 10, DAY, "cost scope '' is not a usable key"),
        ("resource:\x00", "r", 1, 10, DAY, "is not a usable key"),
        ("global", "", 1, 10, DAY, "reservation id '' must not be empty"),
        ("global", "r", -1, 10, DAY, "amount must be an integer from 0"),
        ("global", "r", 1.5, 10, DAY, "amount must be an integer from 0"),
        ("global", "r", 1, True, DAY, "limit must be an integer from 0"),
        ("global", "r", 1, 10, 0, "window_seconds must be a number above 0 and at most 31622400"),
        ("global", "r", 1, 10, 400 * DAY, "window_seconds must be a number above 0 and at most 31622400"),
    ],
)
async def test_bad_input_is_refused_before_anything_is_written(
    store: MemoryStore,
    scope: str,
    reservation: str,
    amount: object,
    limit: object,
    window: float,
    problem: str,
) -> None:
    with pytest.raises(InvalidMemoryInputError, match=problem.replace("(", r"\(")):
        await store.reserve_cost(scope, reservation, amount, limit=limit, window_seconds=window)  # type: ignore[arg-type]
    assert await store.spent_cost("global", window_seconds=DAY) == 0
