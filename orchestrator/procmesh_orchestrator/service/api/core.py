"""The state both APIs serve from: the App, who calls (keys, trust, limits), the run gate and the
runs in flight, sidecar health and the service's metrics.

`ServiceCore` is what the HTTP room, the gRPC room and the rest of the API layer take; `Service`
(``service._service``) is a `ServiceCore` that also runs the two servers and the drain. Depending
on this class, not on `Service`, is what keeps the rooms out of an import circle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from procmesh_orchestrator.app import App, Pipeline
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.errors import ServiceStartError
from procmesh_orchestrator.run import Agent, RunResult
from procmesh_orchestrator.run.context import names as key_names
from procmesh_orchestrator.service._auth import ApiKeys
from procmesh_orchestrator.service._errors import AgentNotFoundError
from procmesh_orchestrator.service._health import DependencyCheck, SidecarHealth, fail_open_sidecars
from procmesh_orchestrator.service._limits import InputLimits, KeyLimits
from procmesh_orchestrator.service._metrics import ServiceMetrics
from procmesh_orchestrator.service._trim import MemoryTrim
from procmesh_orchestrator.service._trust import ContextTrust
from procmesh_orchestrator.service.api.results import model_warnings
from procmesh_orchestrator.service.api.runs import ActiveRuns, RunGate
from procmesh_orchestrator.settings import OrchestratorSettings

log = logging.getLogger(__name__)

HealthListener = Callable[[bool], Awaitable[None]]


class ServiceCore:
    """The App behind the APIs with what every request is checked and counted against.

    Args:
        settings: How to serve (ports, keys, limits).
        config: What to serve (sidecars, models, agents).
        app: An App to serve instead of one built from `config` (tests).
    """

    def __init__(self, settings: OrchestratorSettings, config: Config, *, app: App | None = None) -> None:
        self.settings = settings
        self.app = app or App(config)
        self.keys = ApiKeys(settings.api_keys)  # KeyListError naming a bad entry
        self.trust = ContextTrust.of(
            settings.trusted_context,
            self.keys.callers(),
            legacy=settings.trust_request_context,
            drop=settings.untrusted_context == "drop",
        )
        """Which caller may send which request-context keys (PROCMESH_TRUSTED_CONTEXT)."""
        self.limits = InputLimits(
            max_messages=settings.max_input_messages,
            max_depth=settings.max_input_depth,
            max_string_chars=settings.max_input_string_chars,
        )
        if settings.max_inflight_per_key is not None and not self.keys.enabled:
            raise ServiceStartError(
                "PROCMESH_MAX_INFLIGHT_PER_KEY limits each API key, and no API key is configured "
                "(PROCMESH_API_KEYS): every caller is anonymous, so it would limit nothing"
            )
        self.key_limits = KeyLimits(settings.inflight_per_key)
        """Requests in flight per API key (PROCMESH_MAX_INFLIGHT_PER_KEY), both APIs."""
        self.gate = RunGate()
        self.trim = MemoryTrim(idle=lambda: self.gate.active == 0)
        """Gives a finished stream's memory back to the system (`trim.soon()` at each stream's end)."""
        self.runs = ActiveRuns()
        """The streamed runs in flight on this replica (the cancel route, gRPC cancellation)."""
        self._background: set[asyncio.Task[None]] = set()
        self.health_listeners: list[HealthListener] = []
        """Told when the sidecars' health turns (the gRPC server's health status follows it)."""
        self.health = SidecarHealth(
            self.app.clients,
            settings.health_poll_seconds,
            self._health_turned,
            optional=fail_open_sidecars(self.app.config),
            dependencies=DependencyCheck(self.app),
        )
        self.app.on_swap.append(self._config_swapped)
        self.app.durable_ended.append(self._durable_ended)
        self.metrics = ServiceMetrics(
            self.app.metrics.registry, lambda: self.gate.active, lambda: self.health.statuses
        )

    def note_model_warnings(self, agent_id: str, warnings: list[dict[str, Any]]) -> None:
        """A run's model-call warnings (`results.model_warnings`: settings a model's API has no field
        for, left out of its body), for the operator: a WARNING line and
        ``procmesh_call_settings_ignored_total{setting}``, once per call and setting (`control.finished`,
        `LiveRun.see`, and a durable run's end on the replica it ends on, begun there or taken over):
        a run suspended by a stream and taken on by another call is counted by both."""
        if not warnings:
            return
        names = [f"modelSettings.{w['setting']}" for w in warnings]
        shown = key_names(names)
        log.warning("agent %r: a run's model settings its model does not take: %s", agent_id, shown)
        for warning in warnings:
            self.metrics.settings_ignored.labels(str(warning["setting"])).inc()

    def _durable_ended(self, agent_id: str, done: RunResult) -> None:
        """A durable run ended on this replica (`DurableRuns.ended`): begun here or taken over."""
        self.note_model_warnings(agent_id, model_warnings(done))

    def _config_swapped(self, pipeline: Pipeline) -> None:
        """A reload swapped the config: the health poll's optional sidecars follow it (the
        sidecars themselves are the App's `clients`, updated in place)."""
        self.health.optional = fail_open_sidecars(pipeline.config)

    async def _health_turned(self, serving: bool) -> None:
        for listener in self.health_listeners:
            await listener(serving)

    def agent(self, agent_id: str) -> Agent:
        """The agent with this id; AgentNotFoundError names the configured ones."""
        agent = self.app.agents.get(agent_id)
        if agent is None:
            shown = agent_id if len(agent_id) <= 64 else agent_id[:64] + "..."  # never echo a huge id
            raise AgentNotFoundError(f"unknown agent {shown!r} (configured: {sorted(self.app.agents)})")
        return agent

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background (a streamed run finishing after its client left); the
        service keeps a reference until it is done."""
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
