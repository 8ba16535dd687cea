"""The configuration of durable runs: leases, take-over, and the event log their chunks go to."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class EventLogConfig(_Model):
    """Where durable runs' chunks are kept with their offsets: Redis Streams for several replicas,
    or this process's memory (the embedded default: one replica, nothing to install)."""

    backend: Literal["memory", "redis"] = "memory"
    url: str | None = None
    """Redis: ``redis://host:6379/0`` or ``unix:///path/redis.sock``."""
    url_env: str | None = None
    """Redis: the environment variable holding the URL (a password stays out of the file)."""
    retention_seconds: float = Field(default=86_400.0, gt=0)
    """How long a finished run's chunks can still be read (reattached to)."""

    @model_validator(mode="after")
    def _redis(self) -> EventLogConfig:
        if self.backend == "redis" and not (self.url or self.url_env):
            raise ValueError("the redis event log needs url or urlEnv")
        return self


class DurableConfig(_Model):
    """Durable runs: snapshots at each step in `storage`, leases, chunks in the event log."""

    lease_seconds: float = Field(default=10.0, gt=0)
    """How long a replica holds a run without renewing; a dead replica's runs move after this."""
    claim_interval_seconds: float = Field(default=2.0, gt=0)
    """How often each replica looks for runs whose lease expired."""
    max_runs: int = Field(default=64, ge=1)
    """Durable runs one replica runs at once (its own and those it takes over)."""
    event_log: EventLogConfig = EventLogConfig()
