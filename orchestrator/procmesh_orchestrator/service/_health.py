"""Readiness: every sidecar's grpc.health.v1 status, polled, and what it means for the orchestrator."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from pydantic import BaseModel

from procmesh import ProcessorClient
from procmesh.errors import ProcmeshError
from procmesh_orchestrator.config import Config, ProcessorRef
from procmesh_orchestrator.errors import OrchestratorError

log = logging.getLogger(__name__)

SERVING = "SERVING"
UNREACHABLE = "UNREACHABLE"


def _refs(value: Any) -> Iterator[ProcessorRef]:
    """Every ProcessorRef anywhere in a config value (lanes, workflows, parallel and conditional steps)."""
    if isinstance(value, ProcessorRef):
        yield value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _refs(getattr(value, name))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _refs(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _refs(item)


def fail_open_sidecars(config: Config) -> frozenset[str]:
    """The sidecars whose failures never fail a run: readiness does not wait for them.

    A sidecar is fail-open when its ``on_failure`` is and no enforcing processor reference to it
    overrides that with ``fail-closed`` (a plain ``sidecar/id`` string inherits the sidecar's).
    """
    closed = {
        ref.sidecar for ref in _refs(config) if ref.on_failure == "fail-closed" and ref.mode == "enforce"
    }
    sidecars = config.sidecars.items()
    return frozenset(name for name, s in sidecars if s.on_failure == "fail-open" and name not in closed)


class SidecarHealth:
    """Polls every sidecar's health every `interval` seconds and keeps the latest statuses.

    `on_change(serving)` runs whenever the verdict (all SERVING or not) flips; the
    set of sidecars that are not serving is logged whenever it changes.
    """

    def __init__(
        self,
        clients: Mapping[str, ProcessorClient],
        interval: float,
        on_change: Callable[[bool], Awaitable[None]] | None = None,
        *,
        check_timeout: float = 1.0,
        optional: frozenset[str] = frozenset(),
        dependencies: Callable[[float], Awaitable[dict[str, str]]] | None = None,
    ) -> None:
        self._clients = clients
        self._check_dependencies = dependencies
        self.dependencies: dict[str, str] = {}
        """What else a run needs that did not answer at the last poll (durable runs' ``store`` and
        ``eventLog``), with its status: `DependencyCheck`."""
        self.optional = optional
        """Sidecars that do not count for the verdict (`fail_open_sidecars`): down, they degrade runs."""
        self._interval = interval
        self._check_timeout = check_timeout
        self._on_change = on_change
        self.statuses: dict[str, str] = dict.fromkeys(clients, "UNKNOWN")
        self._serving: bool | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def not_serving(self) -> dict[str, str]:
        """The sidecars whose last status was not SERVING, with that status."""
        return {name: status for name, status in self.statuses.items() if status != SERVING}

    @property
    def blocking(self) -> dict[str, str]:
        """The sidecars not serving that take the orchestrator out of service (not `optional`)."""
        return {name: status for name, status in self.not_serving.items() if name not in self.optional}

    @property
    def serving(self) -> bool:
        """True when every sidecar that counts reported SERVING at the last poll and every
        dependency answered (readiness and the orchestrator's own grpc.health.v1 both follow
        this verdict)."""
        return not self.blocking and not self.dependencies

    async def _check(self, name: str, client: ProcessorClient) -> str:
        try:
            return await client.health(timeout=self._check_timeout)
        except ProcmeshError as exc:
            log.debug("health check of sidecar %s failed: %s", name, exc)
            return UNREACHABLE

    async def poll_once(self) -> None:
        """Check every sidecar once and update the verdict."""
        names = list(self._clients)
        results = await asyncio.gather(*(self._check(n, self._clients[n]) for n in names))
        if self._check_dependencies is not None:
            self.dependencies = await self._check_dependencies(self._check_timeout)
        before = self.not_serving
        self.statuses = dict(zip(names, results, strict=True))
        after = self.not_serving
        if after != before and after:
            log.warning(
                "not serving: %s",
                ", ".join(
                    f"sidecar {n} ({self._clients[n].address}) is {s}" for n, s in sorted(after.items())
                ),
            )
        serving = self.serving
        if serving != self._serving:
            if serving and self._serving is not None:
                log.info("every sidecar is SERVING again, every dependency answers")
            self._serving = serving
            if self._on_change is not None:
                await self._on_change(serving)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.poll_once()
            except Exception:  # a poller that dies would freeze readiness: log and go on
                log.exception("sidecar health poll failed")

    def start(self) -> None:
        """Poll in the background until `stop()`."""
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="procmesh-sidecar-health")

    async def stop(self) -> None:
        """Stop polling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class DependencyCheck:
    """Readiness of durable runs' store and event log, once durable runs are in use.

    Each poll pings the event log (`EventLog.ping`) and reads one row of the store by key (a
    primary-key lookup of a run that does not exist: cheap on SQLite and PostgreSQL). The answer
    names what is down (``{"eventLog": "UNREACHABLE"}``) and never how it is reached; the log line
    written when that changes does.
    """

    PROBE_RUN_ID = "procmesh-readiness-probe"

    def __init__(self, app: Any) -> None:
        self._app = app
        self._down: dict[str, str] = {}

    async def __call__(self, timeout: float) -> dict[str, str]:
        durable = self._app.durable
        if durable is None:  # no durable run yet: nothing of theirs to wait for
            return {}
        down: dict[str, str] = {}
        errors: dict[str, str] = {}

        async def store() -> None:
            opened = await self._app.suspended_runs_store()
            await opened.get_durable_run(self.PROBE_RUN_ID)

        for name, check in (("store", store), ("eventLog", durable.events.ping)):
            try:
                async with asyncio.timeout(timeout):
                    await check()
            except TimeoutError:
                down[name], errors[name] = UNREACHABLE, f"no answer within {timeout:g}s"
            except OrchestratorError as exc:
                down[name], errors[name] = UNREACHABLE, str(exc)
        if down != self._down:
            if down:
                log.warning(
                    "durable runs not ready: %s", "; ".join(f"{n}: {e}" for n, e in sorted(errors.items()))
                )
            else:
                log.info("durable runs: the store and the event log answer again")
            self._down = down
        return down
