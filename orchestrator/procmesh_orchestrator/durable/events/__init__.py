"""The event log of durable runs: every chunk a run streams, by offset, for clients to (re)attach.

`log` holds the contract (`EventLog`) and `open_event_log`; `memory` is the embedded default (one
process), `redis_streams` the shared log of several replicas (one Redis stream per run).
"""

from __future__ import annotations

from procmesh_orchestrator.durable.events.log import EventLog, EventLogConfig, open_event_log
from procmesh_orchestrator.durable.events.memory import MemoryEventLog
from procmesh_orchestrator.durable.events.redis_streams import RedisEventLog

__all__ = ["EventLog", "EventLogConfig", "MemoryEventLog", "RedisEventLog", "open_event_log"]
