"""The event log contract, and `open_event_log(config)` for the backend a configuration names.

Every chunk a durable run streams is appended to its run's log at a monotonic offset (the 0-based
index of the event) before it is sent. A client attaches by run id, on any replica, from an offset,
and gets every later event exactly once and in order: live while the run streams, and after it
ended until the log's retention expires. `tests/integration/test_event_log.py` runs one contract
suite against both backends.

Each run's log has a fence: the highest epoch (the durable run's fencing token, one more at every
claim) that wrote to it or was raised by a claim (`EventLog.fence`). An append or finish that names
an epoch below it is refused (`EventLogFencedError`), checked in the same step that writes, so a
replica that lost the run's lease adds nothing to its log, however long it slept.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.errors import ConfigError, EventLogError, EventLogFencedError

DEFAULT_RETENTION_SECONDS = 86400.0
"""How long a finished run's log stays readable unless the configuration says otherwise: a day."""


class EventLog(Protocol):
    """The events of durable runs, one append-only log per run id."""

    name: str
    """How errors name the log (``memory``, ``redis://host:6379/0``; never a password)."""

    async def start(self) -> None:
        """Connect; `EventLogUnavailableError` when the backend cannot be reached."""

    async def close(self) -> None:
        """Disconnect (idempotent)."""

    async def ping(self) -> None:
        """Health: return when the log answers, `EventLogUnavailableError` when it does not."""

    async def append(
        self, run_id: str, offset: int, chunk: dict[str, Any], *, epoch: int | None = None
    ) -> bool:
        """Store `chunk` as event `offset` of the run's log; False (and nothing written) when the log
        already holds that offset.

        With an `epoch` (the writer's fencing token), the append is refused (`EventLogFencedError`,
        nothing written) when the run's fence is above it, and raises the fence to it otherwise, in
        the same atomic step.

        A replica that took a run over re-publishes the interrupted step, so a duplicate is expected
        and harmless. Offsets come in order: `offset` must be `next_offset(run_id)` (or below, for a
        duplicate); a gap, or a new event after `finish`, is an `EventLogError`.
        """

    async def next_offset(self, run_id: str) -> int:
        """How many events the run's log holds (0 for a run without one)."""

    async def finish(self, run_id: str, retention_seconds: float, *, epoch: int | None = None) -> None:
        """Mark the log complete (readers stop after its last event); it expires `retention_seconds`
        later (its fence with it). Finishing again only restarts the retention. Fenced as `append`."""

    async def fence(self, run_id: str, epoch: int) -> int:
        """Raise the run's fence to `epoch` (never lower it): from now on a write naming a lower
        epoch is refused. The fence as it now is. A replica claiming a run raises it before its
        claim commits."""

    def read(
        self, run_id: str, offset: int = 0, *, poll: float = 1.0
    ) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """Every event from `offset` on as ``(offset, chunk)``, in order, then the new ones as they
        come, until the log is finished.

        Waiting is a blocking read of at most `poll` seconds at a time. A run without a log (never
        existed, or its retention expired) raises `EventLogNotFoundError` before anything is yielded.
        """


class EventLogConfig(BaseModel):
    """Where durable runs' chunks are kept with their offsets (the configuration's
    ``durable.eventLog`` section): Redis Streams for several replicas, or this process's memory
    (the embedded default: one replica, nothing to install)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)

    backend: Literal["memory", "redis"] = "memory"
    url: str | None = None
    """Redis: ``redis://[:password@]host:port/db``, ``rediss://...`` or ``unix:///path.sock``."""
    url_env: str | None = None
    """Redis: the environment variable holding the URL (a password stays out of the file)."""
    retention_seconds: float = Field(default=DEFAULT_RETENTION_SECONDS, gt=0)
    """How long a finished run's chunks can still be read (reattached to): what callers pass to
    `EventLog.finish`."""

    @model_validator(mode="after")
    def _redis(self) -> EventLogConfig:
        if self.backend == "redis" and not (self.url or self.url_env):
            raise ValueError("the redis event log needs url or urlEnv")
        if self.backend == "memory" and (
            given := sorted(to_camel(n) for n in {"url", "url_env"} & self.model_fields_set)
        ):
            # ignored, replicas would each keep their own log: a reattach elsewhere finds nothing
            raise ValueError(
                f"{', '.join(given)}: not read by the memory event log (set backend: redis to use it)"
            )
        return self

    def redis_url(self, environ: Mapping[str, str] | None = None) -> str:
        """The URL, from `url` or the variable `url_env` names; a `ConfigError` when neither gives one."""
        env = os.environ if environ is None else environ
        if self.url_env:
            value = env.get(self.url_env, "")
            if not value:
                raise ConfigError(f"eventLog.urlEnv: the environment variable {self.url_env} is not set")
            return value
        if not self.url:
            raise ConfigError("eventLog: the redis backend needs `url` or `urlEnv`")
        return self.url


def open_event_log(
    config: EventLogConfig | Mapping[str, Any], *, environ: Mapping[str, str] | None = None
) -> EventLog:
    """The log `config` names, not started yet (``await log.start()`` connects).

    `config` is an `EventLogConfig` (the configuration's ``durable.eventLog`` section) or a mapping
    of its keys, camelCase or snake_case; a mapping it refuses is a `ConfigError` naming the key.
    Its `retention_seconds` is for the caller to pass to `EventLog.finish`.
    """
    if not isinstance(config, EventLogConfig):
        try:
            config = EventLogConfig.model_validate(config)
        except ValidationError as exc:
            problems = [
                f"{'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in exc.errors()
            ]
            raise ConfigError(f"eventLog: {'; '.join(problems)}") from None
    if config.backend == "redis":
        from procmesh_orchestrator.durable.events.redis_streams import RedisEventLog

        return RedisEventLog(config.redis_url(environ))
    from procmesh_orchestrator.durable.events.memory import MemoryEventLog

    return MemoryEventLog()


def encode(name: str, run_id: str, offset: int, chunk: dict[str, Any]) -> str:
    """The chunk as compact JSON, after checking the arguments every backend refuses alike."""
    check(name, run_id, offset)
    try:
        return json.dumps(chunk, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EventLogError(f"event log {name}: run {run_id!r}, event {offset}: not JSON: {exc}") from exc


def check_epoch(name: str, run_id: str, epoch: int | None) -> None:
    """An epoch is None (not fenced) or an int >= 1."""
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1):
        raise EventLogError(f"event log {name}: run {run_id!r}: an epoch must be an int >= 1, not {epoch!r}")


def fenced(name: str, run_id: str, epoch: int, current: int, doing: str) -> EventLogFencedError:
    """The refusal of a write under `epoch` to a run whose fence is `current`."""
    return EventLogFencedError(
        f"event log {name}: run {run_id!r}: {doing} under epoch {epoch} refused: the run is at epoch "
        f"{current} (another replica claimed it)",
        epoch,
        current,
    )


def check(name: str, run_id: str, offset: int) -> None:
    """A run id must be a non-empty string, an offset a non-negative int."""
    if not isinstance(run_id, str) or not run_id:
        raise EventLogError(f"event log {name}: a run id must be a non-empty string, not {run_id!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise EventLogError(f"event log {name}: an offset must be an int >= 0, not {offset!r}")
