"""The store's whole contract: threads and messages, runs, the cost ledger, and its lifetime.

One contract, two backends: an embedded SQLite file (the default: nothing to install) and
PostgreSQL (several orchestrator replicas). `tests/integration/memory/test_store_contract.py` runs
the same suite against both. Each aggregate has its own Protocol (`ThreadStore`, `RunStore`,
`CostLedger`, `WorkingMemoryStore`, `DecisionStore`), so code that needs one names only that one;
`MemoryStore` is all of them, started and closed (what `open_store` returns, and what
`App.suspended_runs_store` is).
"""

from __future__ import annotations

from typing import Protocol

from procmesh_orchestrator.store.decisions import DecisionStore
from procmesh_orchestrator.store.ledger import CostLedger
from procmesh_orchestrator.store.runs import RunStore
from procmesh_orchestrator.store.threads import ThreadStore
from procmesh_orchestrator.store.working_memory import WorkingMemoryStore


class MemoryStore(ThreadStore, RunStore, CostLedger, WorkingMemoryStore, DecisionStore, Protocol):
    """Where memory, runs and costs live. Every write is one transaction and idempotent by id."""

    async def start(self) -> None:
        """Connect and apply the schema migrations not applied yet (versioned, at start-up)."""

    async def close(self) -> None:
        """Close connections."""
