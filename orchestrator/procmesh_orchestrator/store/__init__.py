"""The store: threads and their messages, suspended and durable runs, the cost ledger.

What other packages use is named here; the modules starting with ``_`` are the store's own. The
backends (`procmesh_orchestrator.store.sqlite`, `procmesh_orchestrator.store.postgres`) are
imported only by `open_store` when a configuration chooses one, so a SQLite deployment never
loads psycopg.
"""

from procmesh_orchestrator.store._common import MAX_COST_WINDOW_SECONDS, MAX_ID_CHARS, MAX_PAGE, label
from procmesh_orchestrator.store._redact import client_message
from procmesh_orchestrator.store.store import (
    CANCELLED,
    DONE,
    DURABLE_STATUSES,
    FAILED,
    FINISHED,
    RESUMED,
    RESUMING,
    RUNNING,
    SUSPENDED,
    CostAdmission,
    DurableRun,
    MemoryStore,
    Message,
    RunFence,
    SuspendedRun,
    Thread,
)
from procmesh_orchestrator.store.stores import StoreConfig, open_store

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
    "DurableRun",
    "MemoryStore",
    "Message",
    "RunFence",
    "StoreConfig",
    "SuspendedRun",
    "Thread",
    "client_message",
    "label",
    "open_store",
]
