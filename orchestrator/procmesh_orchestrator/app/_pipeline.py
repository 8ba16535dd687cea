"""One config, bound: its sidecars connected, its tools, its models and its agents.

The App serves one `Pipeline` at a time; a reload (`app._reload`) builds the next one beside it
and swaps. A run holds the pipeline it started on (`AgentSpec.pin`), so the old one's channels,
MCP sessions and model clients close only after its last run ends (`retire`): and after the last
of its agents and runs is let go, since a request that took an agent just before the swap may
start its run just after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping

from procmesh_orchestrator.app._attempts import attempt_beginnings
from procmesh_orchestrator.config import Config, SidecarConfig
from procmesh_orchestrator.config.agents import AgentConfig, AgentMemoryConfig
from procmesh_orchestrator.config.lanes import violation_routes
from procmesh_orchestrator.config.memory import WorkingMemoryConfig
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors import GrpcHookCaller, call_lanes
from procmesh_orchestrator.processors.binding import LaneBinder, LaneSource
from procmesh_orchestrator.processors.catalog import SidecarCatalog
from procmesh_orchestrator.processors.decisions import DecisionLog
from procmesh_orchestrator.providers import ModelRegistry
from procmesh_orchestrator.providers.retrying import RetryingModel
from procmesh_orchestrator.run import Agent, AgentSpec, stop
from procmesh_orchestrator.run.framework.cost import CostControl
from procmesh_orchestrator.run.framework.memory import AgentMemory
from procmesh_orchestrator.run.framework.recall import SemanticRecall
from procmesh_orchestrator.run.framework.working_memory import WorkingMemorySettings
from procmesh_orchestrator.run.hooks import RunInfo
from procmesh_orchestrator.run.models import ModelProvider
from procmesh_orchestrator.store import MemoryStore
from procmesh_orchestrator.tools import ToolCatalog

log = logging.getLogger(__name__)


def working_memory_settings(config: WorkingMemoryConfig | None) -> WorkingMemorySettings | None:
    """What the run keeps of an agent's ``memory.workingMemory`` (None when absent or disabled)."""
    if config is None or not config.enabled:
        return None
    return WorkingMemorySettings(config.scope, config.template, config.json_schema, config.agent_managed)


def config_hash(config: Config) -> str:
    """The config's version: the first 12 hex digits of the SHA-256 of its content (keys sorted,
    so the same config in another key order or layout has the same version)."""
    text = json.dumps(config.model_dump(mode="json", by_alias=True), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Pipeline:
    """Everything one config binds: sidecar channels, tools and MCP sessions, models, agents.

    Built unstarted (its catalogs empty); `start()` connects and binds, failing with a
    `ConfigError` naming the key on anything start-up refuses. `runs` counts the runs in flight
    on it (each holds `pin()`); `retire()` waits for them, then closes what it opened.
    """

    def __init__(
        self,
        config: Config,
        metrics: OrchestratorMetrics,
        *,
        sidecars: Mapping[str, SidecarConfig] | None = None,
        connect_timeout: float = 10.0,
        lanes: Mapping[str, Mapping[str, LaneSource]] | None = None,
        ended: Callable[[str], object] | None = None,
        failed: Callable[[str], object] | None = None,
        began: Callable[[str], object] | None = None,
        started: Callable[[str, str], object] | None = None,
    ) -> None:
        self.config = config
        self.ended = ended
        """Told each run's id as the run ends (`AgentSpec.ended`; the App's `run_ended`)."""
        self.failed = failed
        """Told a run's id when one of its model calls failed (`AgentSpec.attempt_failed`; the
        App's `attempt_failed`)."""
        self.began = began
        """Told a run's id as it calls a hook other than ``process_api_error`` (`attempt_beginnings`;
        the App's `began`: a failed attempt's next one has begun)."""
        self.started = started
        """Told each run's id and agent as its hook caller is made (the App's `started`)."""
        self.lane_functions = lanes or {}
        """Lanes given as functions of the request context, by agent and lane (`App`'s ``lanes=``)."""
        self.version = config_hash(config)
        self.metrics = metrics
        self.sidecars = SidecarCatalog(
            config.sidecars if sidecars is None else sidecars, connect_timeout=connect_timeout
        )
        self.binder = LaneBinder(self.sidecars, config.workflows)
        self.models = ModelRegistry(config)
        """Models by reference: ``models`` keys, and ``provider/model-id`` created on first use."""
        self.tools = ToolCatalog(config)
        self.agents: dict[str, Agent] = {}
        self.runs = 0
        """Runs in flight that started on this pipeline."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self._held: weakref.WeakSet[object] = weakref.WeakSet()
        """Its agents and its runs' hook callers still in use somewhere (a run created, an agent a
        request took before a swap): the pipeline closes only once they are all gone."""

    async def start(
        self,
        *,
        store: MemoryStore | None,
        suspended_runs_store: Callable[[], Awaitable[MemoryStore]],
    ) -> None:
        """Connect the sidecars (each must answer Describe), bind the tools and every agent's lanes.

        `store` is the open store when an agent has memory; `suspended_runs_store` opens it on
        first use (suspended runs, cost ledgers).
        """
        await self.sidecars.connect()
        await self.tools.start(self.sidecars)
        if unknown := sorted(set(self.lane_functions) - set(self.config.agents)):
            raise ConfigError(f"App lanes= names agents the config does not have: {unknown}")
        for agent_id, agent in self.config.agents.items():
            chain = self._model_chain(agent, f"agents.{agent_id}.model")
            lanes = self.binder.lanes(agent_id, agent, self.lane_functions.get(agent_id))
            spec = AgentSpec(
                id=agent_id,
                model=chain[0],
                fallbacks=tuple(chain[1:]),
                cost=self._cost_control(agent_id, agent, suspended_runs_store),
                violation_routes=violation_routes(
                    agent.lane_candidates(f"agents.{agent_id}."), self.config.workflows
                ),
                hook_caller=self._caller,
                instructions=agent.instructions,
                models=self.models,
                tools=self.tools.for_agent(agent_id, agent),
                max_steps=agent.max_steps,
                tool_call_concurrency=agent.tool_call_concurrency,
                stop_when=stop.parse(agent.stop_when),
                max_processor_retries=agent.max_processor_retries,
                lanes=lanes,
                memory=self._with_recall(self._memory(agent.memory, store), agent.memory),
                store=suspended_runs_store,
                fuse=self.config.fuse if agent.fuse is None else agent.fuse,
                optimistic_first_step=agent.optimistic_first_step,
                request_context_schema=agent.request_context_schema,
                bind_lanes=functools.partial(call_lanes.bind, self.binder, lanes),
                pin=self.pin,
                ended=self.ended,
                attempt_failed=self.failed,
            )
            self.agents[agent_id] = Agent(spec, self.metrics)
            self._held.add(self.agents[agent_id])

    def _caller(self, info: RunInfo, metrics: OrchestratorMetrics) -> GrpcHookCaller:
        """A run's hook caller (`GrpcHookCaller`), kept track of: it lives as long as its run."""
        if self.started is not None:
            self.started(info.run_id, info.agent_id)
        if self.began is None:
            caller = GrpcHookCaller(info, metrics)
        else:
            caller = GrpcHookCaller(info, metrics, on_call=attempt_beginnings(info, self.began))
        if self.config.decisions.record:
            inputs = self.config.agents[info.agent_id].record_inputs
            caller.decisions = info.decisions = DecisionLog(self.config.decisions, inputs=inputs)
        self._held.add(caller)
        return caller

    def _model_chain(self, agent: AgentConfig, where: str) -> list[ModelProvider]:
        """The agent's enabled models in order, each with its own retries."""
        chain: list[ModelProvider] = []
        for choice in agent.models:
            model = self.models.resolve(choice.model, where)
            chain.append(RetryingModel(model, choice.max_retries) if choice.max_retries else model)
        return chain

    def _cost_control(
        self, agent_id: str, agent: AgentConfig, store: Callable[[], Awaitable[MemoryStore]]
    ) -> CostControl | None:
        if agent.cost_limit is None:
            return None
        return CostControl(agent_id, agent.cost_limit, self.config.prices, store, self.metrics)

    def _memory(self, config: AgentMemoryConfig | None, store: MemoryStore | None) -> AgentMemory | None:
        if config is None:
            return None
        assert store is not None
        name = str(getattr(store, "name", "") or f"{self.config.storage.backend} store")
        window_given = "last_messages" in config.model_fields_set
        budget = config.message_history.budget() if config.message_history else None
        return AgentMemory(
            store,
            config.last_messages if window_given or budget is None else None,
            name,
            working_memory_settings(config.working_memory),
            config.read_only,
            message_history=budget,
            window_given=window_given,
        )

    def _with_recall(
        self, memory: AgentMemory | None, config: AgentMemoryConfig | None
    ) -> AgentMemory | None:
        """The agent's memory with its semantic recall, when it configures one."""
        if memory is None or config is None or config.semantic_recall is None:
            return memory
        cfg = config.semantic_recall
        recall = SemanticRecall(cfg, self.models.embedder(cfg.embedder), memory.store, self.metrics)
        return dataclasses.replace(memory, recall=recall)

    @contextlib.contextmanager
    def pin(self) -> Iterator[None]:
        """Held by each run for its whole length: the pipeline is not closed under it."""
        self.runs += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.runs -= 1
            if self.runs == 0:
                self._idle.set()

    async def retire(self) -> None:
        """Wait for the runs that started on this pipeline and for every agent and run of it to be
        let go, then close it."""
        self.agents = {}  # the App serves another pipeline: only callers that took one hold them
        waited = 0
        while True:
            await self._idle.wait()
            if not self._held:
                break
            waited += 1
            if waited % 20 == 0:  # a run that ended may sit in a reference cycle
                gc.collect()
            if waited == 600:
                log.warning(
                    "config version %s: still in use a minute after a reload (%d agents and runs "
                    "held); its sidecar channels stay open until they are let go",
                    self.version,
                    len(self._held),
                )
            await asyncio.sleep(0.1)
        await self.close()
        log.info(
            "config version %s retired: its last run ended, its sidecar channels are closed", self.version
        )

    async def close(self) -> None:
        """Close every sidecar channel, MCP session and model client this pipeline opened (once)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.gather(self.sidecars.close(), self.models.aclose(), self.tools.close())
