"""Cost control's usage ledger in both stores: the same SQL given the backend's clock.

A reservation of a durable run's call (and its settling or release) is given the run's fence: the
run's row is read locked first in the same transaction (`_durable.hold_fence`), so a replica that
lost the run's lease reserves (and so calls a model) nothing more.
"""

from __future__ import annotations

import math
from typing import Any

from procmesh_orchestrator.errors import InvalidMemoryInputError
from procmesh_orchestrator.store._checks import MAX_ID_CHARS, check_count, check_id, label
from procmesh_orchestrator.store._durable import check_fence, hold_fence
from procmesh_orchestrator.store._sql import Query, StoreHooks
from procmesh_orchestrator.store.ledger import MAX_COST_WINDOW_SECONDS, CostAdmission
from procmesh_orchestrator.store.runs import RunFence

MAX_SCOPE_CHARS = 2 * MAX_ID_CHARS
"""A cost scope key is a kind and an id (``resource:<id>``)."""
MAX_COST_AMOUNT = 2**62
"""Nano-units: about 4.6e9 of the currency per reservation or limit, far past any real budget."""


def check_window(store: str, value: object) -> float:
    """A cost window in seconds: a finite number above 0 and at most `MAX_COST_WINDOW_SECONDS`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= MAX_COST_WINDOW_SECONDS
    ):
        raise InvalidMemoryInputError(
            f"memory store {store}: window_seconds must be a number above 0 and at most "
            f"{MAX_COST_WINDOW_SECONDS}, got {label(value)}"
        )
    return float(value)


def check_scope(store: str, value: object) -> str:
    """A cost scope key: a non-empty printable string of at most `MAX_SCOPE_CHARS`."""
    if not isinstance(value, str) or not value or len(value) > MAX_SCOPE_CHARS or not value.isprintable():
        raise InvalidMemoryInputError(f"memory store {store}: cost scope {label(value)} is not a usable key")
    return value


def check_amount(store: str, name: str, value: object) -> int:
    """A cost in nano-units: a non-negative integer."""
    return check_count(store, name, value, low=0, high=MAX_COST_AMOUNT)


class CostMethods(StoreHooks):
    """Cost control's usage ledger, the same SQL on both backends given the backend's clock (`_now`,
    `_ago`) and how an admission locks its scope's row, and a fenced write its run's row, until it
    commits (`_for_update`)."""

    async def reserve_cost(
        self,
        scope_key: str,
        reservation_id: str,
        amount: int,
        *,
        limit: int,
        window_seconds: float,
        enforce: bool = True,
        fence: RunFence | None = None,
    ) -> CostAdmission:
        """Admit a call if the scope spent less than `limit` in the window (reservations included)
        and hold `amount` for it, atomically: of concurrent admissions, each sees the ones that
        went before. With `enforce` False the amount is held whatever the spending (warn mode). With
        a `fence`, only while the durable run holds its epoch (`FencedWriteError`, nothing held)."""
        scope_key = check_scope(self.name, scope_key)
        reservation_id = check_id(self.name, "reservation", reservation_id)
        amount = check_amount(self.name, "amount", amount)
        limit = check_amount(self.name, "limit", limit)
        window = self._ago_arg(check_window(self.name, window_seconds))
        held = None if fence is None else check_fence(self.name, fence)
        p = self.placeholder
        # Usage older than the longest window any limit reads is never read again.
        oldest = self._ago_arg(float(MAX_COST_WINDOW_SECONDS))

        async def admit(query: Query) -> CostAdmission:
            if held is not None:
                await self._fence(query, held, f"reserving cost in {scope_key!r}")
            await query(
                f"INSERT INTO cost_scopes (scope_key) VALUES ({p}) ON CONFLICT DO NOTHING", (scope_key,)
            )
            await query(
                f"SELECT scope_key FROM cost_scopes WHERE scope_key = {p}{self._for_update}", (scope_key,)
            )
            await query(
                f"DELETE FROM cost_usage WHERE scope_key = {p} AND created_at < {self._ago}",
                (scope_key, oldest),
            )
            rows = await query(
                f"SELECT COALESCE(SUM(amount), 0) FROM cost_usage WHERE scope_key = {p} "
                f"AND created_at >= {self._ago}",
                (scope_key, window),
            )
            spent = int(rows[0][0])
            admitted = spent < limit
            if admitted or not enforce:
                sql = (
                    "INSERT INTO cost_usage (id, scope_key, amount, created_at) "
                    f"VALUES ({p}, {p}, {p}, {self._now})"
                )
                await query(sql, (reservation_id, scope_key, amount))
            return CostAdmission(admitted, spent)

        return await self._transact(admit, f"reserving cost in {scope_key!r}")

    async def settle_cost(self, reservation_id: str, amount: int, *, fence: RunFence | None = None) -> None:
        """Replace the reservation's estimate with what the call actually cost (fenced as a
        reservation)."""
        reservation_id = check_id(self.name, "reservation", reservation_id)
        amount = check_amount(self.name, "amount", amount)
        p = self.placeholder
        sql = f"UPDATE cost_usage SET amount = {p}, settled = TRUE WHERE id = {p}"
        doing = f"settling cost reservation {reservation_id!r}"
        await self._write_fenced(sql, (amount, reservation_id), fence, doing)

    async def release_cost(self, reservation_id: str, *, fence: RunFence | None = None) -> None:
        """Drop an unsettled reservation (its call did not run, or failed); no error when none
        (fenced as a reservation)."""
        reservation_id = check_id(self.name, "reservation", reservation_id)
        sql = f"DELETE FROM cost_usage WHERE id = {self.placeholder} AND NOT settled"
        doing = f"releasing cost reservation {reservation_id!r}"
        await self._write_fenced(sql, (reservation_id,), fence, doing)

    async def _write_fenced(
        self, sql: str, args: tuple[Any, ...], fence: RunFence | None, doing: str
    ) -> None:
        """One statement in one write transaction; with a fence, after `hold_fence` in it."""
        if fence is None:
            await self._execute(sql, args, doing)
            return
        held = check_fence(self.name, fence)

        async def write(query: Query) -> None:
            await self._fence(query, held, doing)
            await query(sql, args)

        await self._transact(write, doing)

    async def _fence(self, query: Query, fence: RunFence, doing: str) -> None:
        await hold_fence(self.name, query, fence, self.placeholder, self._for_update, doing)

    async def spent_cost(self, scope_key: str, *, window_seconds: float) -> int:
        """What the scope spent in the window, unsettled reservations at their estimate."""
        scope_key = check_scope(self.name, scope_key)
        window = self._ago_arg(check_window(self.name, window_seconds))
        p = self.placeholder
        sql = (
            f"SELECT COALESCE(SUM(amount), 0) FROM cost_usage WHERE scope_key = {p} "
            f"AND created_at >= {self._ago}"
        )
        rows = await self._read(sql, (scope_key, window), f"reading the cost of {scope_key!r}")
        return int(rows[0][0])
