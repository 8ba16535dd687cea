"""The store: threads and their messages, suspended and durable runs, the cost ledger.

One module per aggregate, each with its records and its Protocol: `threads` (`ThreadStore`), `runs`
(`RunStore`: suspended and durable runs, snapshots, leases, fences), `ledger` (`CostLedger`),
`decisions` (`DecisionStore`: runs' decision records);
`contract` joins them into `MemoryStore`, and `config` opens the one a configuration names. What
other packages use is named here; the modules starting with ``_`` are the store's own. The
backends (`procmesh_orchestrator.store.sqlite`, `procmesh_orchestrator.store.postgres`) are
imported only by `open_store` when a configuration chooses one, so a SQLite deployment never
loads psycopg.
"""

from procmesh_orchestrator.store._checks import MAX_ID_CHARS, MAX_PAGE, label
from procmesh_orchestrator.store._redact import about_the_request, client_message
from procmesh_orchestrator.store.config import StorageConfig, open_store
from procmesh_orchestrator.store.contract import MemoryStore
from procmesh_orchestrator.store.decisions import Decision, DecisionStore
from procmesh_orchestrator.store.ledger import MAX_COST_WINDOW_SECONDS, CostAdmission, CostLedger
from procmesh_orchestrator.store.runs import (
    CANCELLED,
    DONE,
    DURABLE_STATUSES,
    FAILED,
    FINISHED,
    RESUMED,
    RESUMING,
    RUNNING,
    SUSPENDED,
    DurableRun,
    RunFence,
    RunStore,
    SuspendedRun,
)
from procmesh_orchestrator.store.threads import Message, Thread, ThreadOrder, ThreadStore

__all__ = [
    "CANCELLED",
    "DONE",
    "DURABLE_STATUSES",
    "FAILED",
    "FINISHED",
    "MAX_COST_WINDOW_SECONDS",
    "MAX_ID_CHARS",
    "MAX_PAGE",
    "RESUMED",
    "RESUMING",
    "RUNNING",
    "SUSPENDED",
    "CostAdmission",
    "CostLedger",
    "Decision",
    "DecisionStore",
    "DurableRun",
    "MemoryStore",
    "Message",
    "RunFence",
    "RunStore",
    "StorageConfig",
    "SuspendedRun",
    "Thread",
    "ThreadOrder",
    "ThreadStore",
    "about_the_request",
    "client_message",
    "label",
    "open_store",
]
