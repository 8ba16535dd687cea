"""Cost control's ledger: the store's third aggregate.

Model calls' costs are kept per scope: a call reserves its estimate atomically against the scope's
limit (`CostLedger.reserve_cost`), then settles to its actual cost, or releases it when the call
did not run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from procmesh_orchestrator.store.runs import RunFence

MAX_COST_WINDOW_SECONDS = 366 * 86400
"""The longest cost window: usage older than this is never read again, so an admission prunes it."""


@dataclass(frozen=True)
class CostAdmission:
    """A cost reservation's answer (`CostLedger.reserve_cost`): may the call run, and what had the
    scope spent."""

    admitted: bool
    spent: int
    """Nano-units spent in the window before this reservation (unsettled ones at their estimate)."""


class CostLedger(Protocol):
    """Model calls' costs per scope, in nano-units, on the database's clock."""

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
        """In one transaction: sum what `scope_key` spent in the last `window_seconds` (database
        clock; unsettled reservations at their estimate) and, if it is below `limit` (or not
        `enforce`), hold `amount` nano-units under `reservation_id`. Of concurrent reservations of
        one scope, in any process, each sums the ones committed before it. With a `fence` (a
        durable run's call), only while the run holds that epoch (`FencedWriteError`)."""

    async def settle_cost(self, reservation_id: str, amount: int, *, fence: RunFence | None = None) -> None:
        """Replace the reservation's estimate with the call's actual cost (no error when none)."""

    async def release_cost(self, reservation_id: str, *, fence: RunFence | None = None) -> None:
        """Drop an unsettled reservation: its call did not run or failed (no error when none)."""

    async def spent_cost(self, scope_key: str, *, window_seconds: float) -> int:
        """What the scope spent in the last `window_seconds`, in nano-units."""
