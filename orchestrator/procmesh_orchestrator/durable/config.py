"""The configuration of durable runs: leases, take-over, and the event log their chunks go to."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.durable.events import EventLogConfig


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class DurableConfig(_Model):
    """Durable runs: snapshots at each step in `storage`, leases, chunks in the event log."""

    lease_seconds: float = Field(default=10.0, gt=0)
    """How long a replica holds a run without renewing; a dead replica's runs move after this."""
    claim_interval_seconds: float = Field(default=2.0, gt=0)
    """How often each replica looks for runs whose lease expired."""
    max_runs: int = Field(default=64, ge=1)
    """Durable runs one replica runs at once (its own and those it takes over)."""
    event_log: EventLogConfig = EventLogConfig()
