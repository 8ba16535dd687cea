"""Composition root: connects to the sidecars, checks what they host, builds the agents."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from procmesh import ProcessorClient, channel_credentials, convert
from procmesh.errors import ProcmeshError
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator import call_lanes
from procmesh_orchestrator.agent_tools import ToolCatalog
from procmesh_orchestrator.config import (
    BUILTINS,
    ConditionalStep,
    Config,
    LaneEntry,
    ParallelStep,
    ProcessorRef,
    SidecarConfig,
    WorkflowRef,
    workflow_refs,
)
from procmesh_orchestrator.config.schema import (
    DEFAULT_PROVIDERS,
    AgentConfig,
    AgentMemoryConfig,
    LaneByContext,
)
from procmesh_orchestrator.cost import CostControl
from procmesh_orchestrator.durable import DurableRuns, DurableSettings, config_version
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.events import EventLog, open_event_log
from procmesh_orchestrator.memory.store import MemoryStore
from procmesh_orchestrator.memory.stores import open_store
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors import (
    Conditional,
    GrpcHookCaller,
    LaneItem,
    ParallelGroup,
    ProcessorHandle,
    hook_names,
    options,
)
from procmesh_orchestrator.providers import ModelRegistry
from procmesh_orchestrator.providers.retrying import RetryingModel
from procmesh_orchestrator.run import Agent, AgentSpec, Lanes, stop
from procmesh_orchestrator.run.memory import AgentMemory
from procmesh_orchestrator.run.models import ModelProvider
from procmesh_orchestrator.run.types import ContextLane
from procmesh_orchestrator.sidecar_process import (
    ModelGateway,
    SidecarProcess,
    sidecar_environment,
    supervise,
)

log = logging.getLogger(__name__)

DEFAULT_ERROR_PROCESSORS = (
    "provider-history-compat",
    "prefill-error-handler",
    "unsupported-file-handler",
    "stream-error-retry-processor",
)
"""The default error processors, in the default order (SPEC §5)."""


def merge_error_defaults(
    user: list[ProcessorHandle], defaults: list[ProcessorHandle]
) -> list[ProcessorHandle]:
    """Add each default whose id the user's list lacks, placed by the default order.

    The user's processors keep their order. A missing default goes before the
    first listed default-id processor that comes later in the default order,
    else after the last one that comes earlier, else at the end.
    """
    rank = {pid: i for i, pid in enumerate(DEFAULT_ERROR_PROCESSORS)}
    out = list(user)
    present = {h.processor_id for h in user}
    for handle in sorted(defaults, key=lambda h: rank[h.processor_id]):
        if handle.processor_id in present:
            continue
        k = rank[handle.processor_id]
        later = [i for i, h in enumerate(out) if rank.get(h.processor_id, -1) > k]
        earlier = [i for i, h in enumerate(out) if -1 < rank.get(h.processor_id, -1) < k]
        pos = later[0] if later else (earlier[-1] + 1 if earlier else len(out))
        out.insert(pos, handle)
        present.add(handle.processor_id)
    return out


def secret_variables(config: Config) -> set[str]:
    """The variables the orchestrator reads a secret from: each provider's `apiKeyEnv` (the
    built-in providers' included), the store's `dsnEnv`, the event log's `urlEnv`, and its own API
    keys (``PROCMESH_API_KEYS``). A sidecar it starts gets none of them (`sidecar_environment`)."""
    providers = {**DEFAULT_PROVIDERS, **config.providers}
    names = {p.api_key_env for p in providers.values()}
    names |= {config.storage.dsn_env, config.durable.event_log.url_env, "PROCMESH_API_KEYS"}
    return {name for name in names if name}


class App:
    """Everything the orchestrator runs: sidecar clients, models, tools and agents.

    Use as an async context manager: entering connects to every sidecar, calls
    `Describe` and fails with a clear `ConfigError` when a referenced processor
    is not hosted there.
    """

    def __init__(
        self, config: Config, *, metrics: OrchestratorMetrics | None = None, connect_timeout: float = 10.0
    ) -> None:
        self.config = config
        self.metrics = metrics or OrchestratorMetrics()
        self.clients: dict[str, ProcessorClient] = {}
        self.catalog: dict[str, dict[str, ppb.ProcessorInfo]] = {}
        self.models = ModelRegistry(config)
        """Models by reference: ``models`` keys, and ``provider/model-id`` created on first use."""
        self.tools = ToolCatalog(config)
        self.hosted_tools: dict[str, dict[str, ppb.HostedTool]] = {}
        """Each sidecar's hosted tools (Describe), by name."""
        self.fusing: set[str] = set()
        """The sidecars whose Describe says they run fused requests."""
        self.agents: dict[str, Agent] = {}
        self._connect_timeout = connect_timeout
        self.sidecars: dict[str, SidecarConfig] = dict(config.sidecars)
        self.builtins: SidecarProcess | None = None
        self._builtins_dir: str | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self.store: MemoryStore | None = None
        """The store (`Config.storage`): opened at start when an agent has memory, else when a run
        first suspends for a tool approval."""
        self._store_lock = asyncio.Lock()
        self.events: EventLog | None = None
        """Durable runs' event log (`Config.durable.eventLog`), when an agent is durable."""
        self.durable: DurableRuns | None = None
        """Durable runs of this replica and the take-over of others' (`durable` package)."""
        self._durable_lock = asyncio.Lock()

    def _needs_builtins(self) -> bool:
        named = [
            r
            for a in self.config.agents.values()
            for _, lane in a.named_lanes()
            for r in lane
            if isinstance(r, ProcessorRef)
        ]
        named += [r for w in self.config.workflows.values() for step in w.steps for r in workflow_refs(step)]
        return any(a.error_processor_defaults for a in self.config.agents.values()) or any(
            r.sidecar == BUILTINS for r in named
        )

    async def _start_builtins(self, gateway: ModelGateway | None) -> None:
        """Start and supervise the built-in sidecar on a private unix socket (none was configured),
        without the provider keys and pointed at the model gateway (its guards judge through it)."""
        self._builtins_dir = tempfile.mkdtemp(prefix="procmesh-builtins-")
        os.chmod(self._builtins_dir, 0o700)
        address = f"unix://{os.path.join(self._builtins_dir, 'builtins.sock')}"
        self.builtins = SidecarProcess(
            ["builtins", "--parent-pid", str(os.getpid())],
            address,
            log_path=os.path.join(self._builtins_dir, "builtins.log"),
            env=sidecar_environment(os.environ, secret_variables(self.config), gateway),
        )
        self.builtins.start()
        await self.builtins.wait_ready(self._connect_timeout)
        self.sidecars[BUILTINS] = SidecarConfig(address=address)
        # Restarted when it exits (clients reconnect by themselves), with crash-loop backoff.
        self._supervisor = asyncio.create_task(
            supervise(self.builtins, connect_timeout=self._connect_timeout)
        )

    async def start(self, *, gateway: ModelGateway | None = None) -> None:
        """Connect to the sidecars (waiting up to the connect timeout) and build the agents.

        `gateway` is where a built-in sidecar this App starts reaches the model gateway (the
        Service's gRPC server; None: no gateway, its guards then fail to judge).
        """
        if BUILTINS not in self.sidecars and self._needs_builtins():
            await self._start_builtins(gateway)
        for name, sidecar in self.sidecars.items():
            tls = sidecar.tls
            credentials = channel_credentials(tls.ca, tls.cert, tls.key) if tls else None
            self.clients[name] = ProcessorClient(
                sidecar.address, credentials=credentials, server_name=tls.server_name if tls else None
            )
        await asyncio.gather(*(self._describe(name) for name in self.clients))
        if any(a.memory is not None for a in self.config.agents.values()):
            await self._open_store()
        await self.tools.start(self.clients, self.sidecars, self.hosted_tools)
        for agent_id, agent in self.config.agents.items():
            chain = self._model_chain(agent, f"agents.{agent_id}.model")
            spec = AgentSpec(
                id=agent_id,
                model=chain[0],
                fallbacks=tuple(chain[1:]),
                cost=self._cost_control(agent_id, agent),
                hook_caller=GrpcHookCaller,
                instructions=agent.instructions,
                models=self.models,
                tools=self.tools.for_agent(agent_id, agent),
                max_steps=agent.max_steps,
                stop_when=stop.parse(agent.stop_when),
                max_processor_retries=agent.max_processor_retries,
                lanes=Lanes(
                    input=tuple(
                        self.resolve_lane(agent.input_processors, f"agents.{agent_id}.inputProcessors")
                    ),
                    output=tuple(
                        self.resolve_lane(agent.output_processors, f"agents.{agent_id}.outputProcessors")
                    ),
                    error=tuple(
                        self._error_lane(
                            agent.error_processors,
                            agent.error_processor_defaults,
                            f"agents.{agent_id}.errorProcessors",
                        )
                    ),
                    input_by_context=self._context_lane(
                        agent.input_processors_by_context, f"agents.{agent_id}.inputProcessorsByContext"
                    ),
                    output_by_context=self._context_lane(
                        agent.output_processors_by_context, f"agents.{agent_id}.outputProcessorsByContext"
                    ),
                ),
                memory=self._memory(agent.memory),
                store=self.suspended_runs_store,
                fuse=self.config.fuse if agent.fuse is None else agent.fuse,
                optimistic_first_step=agent.optimistic_first_step,
                bind_lanes=functools.partial(call_lanes.bind, self, agent_id),
            )
            self.agents[agent_id] = Agent(spec, self.metrics)
        if any(a.durable for a in self.config.agents.values()):
            await self.durable_runs()

    def _model_chain(self, agent: AgentConfig, where: str) -> list[ModelProvider]:
        """The agent's enabled models in order, each with its own retries."""
        chain: list[ModelProvider] = []
        for choice in agent.models:
            model = self.models.resolve(choice.model, where)
            chain.append(RetryingModel(model, choice.max_retries) if choice.max_retries else model)
        return chain

    def _cost_control(self, agent_id: str, agent: AgentConfig) -> CostControl | None:
        if agent.cost_control is None:
            return None
        return CostControl(
            agent_id, agent.cost_control, self.config.prices, self.suspended_runs_store, self.metrics
        )

    async def durable_runs(self) -> DurableRuns:
        """The durable-run manager (`durable` package) and its event log, started on first use: at
        `start()` when an agent is durable, else by the first call that asks for a durable run.
        Concurrent first calls share one manager."""
        async with self._durable_lock:
            if self.durable is None:
                await self._start_durable()
        assert self.durable is not None
        return self.durable

    async def _start_durable(self) -> None:
        if self.durable is None:
            events = open_event_log(self.config.durable.event_log)
            self.events = events  # closed by stop() even when start() fails half-way
            await events.start()
            cfg = self.config.durable
            settings = DurableSettings(
                lease_seconds=cfg.lease_seconds,
                claim_interval_seconds=cfg.claim_interval_seconds,
                retention_seconds=cfg.event_log.retention_seconds,
                max_runs=cfg.max_runs,
            )
            specs = {agent_id: agent.spec for agent_id, agent in self.agents.items()}
            versions = {
                agent_id: config_version(self.config.agents[agent_id])
                for agent_id in specs
                if agent_id in self.config.agents
            }
            durable = DurableRuns(
                self.suspended_runs_store, events, specs, self.metrics, settings, versions=versions
            )
            self.durable = durable
            await durable.start()

    async def _open_store(self) -> MemoryStore:
        """Open the configured store and apply its migrations (versioned)."""
        async with self._store_lock:
            if self.store is None:
                store = open_store(self.config.storage)
                self.store = store  # closed by stop() even when start() fails half-way
                await store.start()
            return self.store

    async def suspended_runs_store(self) -> MemoryStore:
        """The store suspended runs are kept in: the configured one, opened on first use (an app
        whose agents have no memory and never suspend writes nothing)."""
        return await self._open_store()

    def _memory(self, config: AgentMemoryConfig | None) -> AgentMemory | None:
        if config is None:
            return None
        assert self.store is not None
        name = str(getattr(self.store, "name", "") or f"{self.config.storage.backend} store")
        return AgentMemory(self.store, config.last_messages, name)

    async def _describe(self, name: str) -> None:
        client = self.clients[name]
        deadline = asyncio.get_running_loop().time() + self._connect_timeout
        while True:
            try:
                described = await client.describe(timeout=1.0)
                break
            except ProcmeshError as exc:
                if asyncio.get_running_loop().time() >= deadline:
                    raise ConfigError(
                        f"sidecars.{name}: cannot reach {client.address} "
                        f"within {self._connect_timeout}s: {exc}"
                    ) from None
                await asyncio.sleep(0.1)
        self.catalog[name] = {p.id: p for p in described.processors}
        self.hosted_tools[name] = {t.name: t for t in described.tools}
        if described.fuses:
            self.fusing.add(name)

    def _error_lane(self, refs: Sequence[ProcessorRef], defaults: bool, where: str) -> list[ProcessorHandle]:
        user = self.resolve(refs, where)
        if not defaults:
            return user
        return merge_error_defaults(
            user, self.resolve([f"{BUILTINS}/{pid}" for pid in DEFAULT_ERROR_PROCESSORS])
        )

    def resolve(
        self, refs: Sequence[LaneEntry | str | dict[str, Any]], where: str = "processors"
    ) -> list[ProcessorHandle]:
        """Bind processor references (``sidecar/id`` strings or ProcessorRef) to their sidecars."""
        return [self._bind(raw, f"{where}.{i}") for i, raw in enumerate(refs)]

    def _bind(self, raw: LaneEntry | str | dict[str, Any], where: str) -> ProcessorHandle:
        if isinstance(raw, WorkflowRef):
            raise ConfigError(f"{where}: a workflow cannot be used here")
        ref = (
            raw
            if isinstance(raw, ProcessorRef)
            else ProcessorRef.model_validate({"processor": raw} if isinstance(raw, str) else raw)
        )
        sidecar = self.sidecars.get(ref.sidecar)
        hosted = self.catalog.get(ref.sidecar)
        if sidecar is None or hosted is None:
            raise ConfigError(f"{where}: unknown or unconnected sidecar {ref.sidecar!r}")
        info = hosted.get(ref.processor_id)
        if info is None:
            raise ConfigError(
                f"{where}: sidecar {ref.sidecar!r} does not host processor "
                f"{ref.processor_id!r} (it hosts {sorted(hosted)})"
            )
        bound = options.bind(ref.processor, ref.options, info.options_schema_json, where)
        if ref.speculative and not info.speculative:
            raise ConfigError(
                f"{where}.speculative: processor {ref.processor!r} does not declare itself "
                "speculative in Describe (only a processor may say its calls can be thrown away)"
            )
        shadow = ref.mode == "shadow"
        return ProcessorHandle(
            key=ref.processor if ref.name is None else f"{ref.processor}#{ref.name}",
            processor_id=ref.instance,
            hosted_id=ref.processor_id,
            client=self.clients[ref.sidecar],
            options=convert.to_struct(bound.static),
            fixed_options=bound.fixed if bound.taken else None,
            context_options=bound.taken,
            options_problem=bound.problem if bound.taken else None,
            hooks=hook_names(info.hooks),
            process_data_parts=info.process_data_parts,
            timeout=ref.timeout or sidecar.timeout,
            stream_timeout=ref.stream_timeout or sidecar.stream_timeout,
            on_failure="fail-open" if shadow else ref.on_failure or sidecar.on_failure,
            shadow=shadow,
            speculative=info.speculative and ref.speculative is not False,
            # a shadow processor's verdict is not the run's: it never shares a request
            fuse_key=ref.sidecar if ref.sidecar in self.fusing and not shadow else "",
        )

    def _context_lane(self, chosen: LaneByContext | None, where: str) -> ContextLane | None:
        """Bind every case and the default of a lane chosen from the request context."""
        if chosen is None:
            return None
        return ContextLane(
            key=chosen.key,
            cases={
                name: tuple(self.resolve_lane(lane, f"{where}.cases.{name}"))
                for name, lane in chosen.cases.items()
            },
            default=tuple(self.resolve_lane(chosen.default, f"{where}.default")),
        )

    def resolve_lane(self, entries: Sequence[LaneEntry | str], where: str) -> list[LaneItem]:
        """Bind a lane's entries; a ``workflow:NAME`` entry becomes its steps, in order."""
        items: list[LaneItem] = []
        for i, raw in enumerate(entries):
            entry = raw
            if isinstance(raw, str):
                entry = (
                    WorkflowRef(workflow=raw[len("workflow:") :])
                    if raw.startswith("workflow:")
                    else (ProcessorRef(processor=raw))
                )
            if isinstance(entry, ProcessorRef):
                items.append(self._bind(entry, f"{where}.{i}"))
                continue
            assert isinstance(entry, WorkflowRef)
            workflow = self.config.workflows.get(entry.workflow)
            if workflow is None:
                raise ConfigError(f"{where}.{i}: unknown workflow {entry.workflow!r}")
            for j, step in enumerate(workflow.steps):
                at = f"workflows.{entry.workflow}.steps.{j}"
                if isinstance(step, ParallelStep):
                    branches = tuple(self.resolve(step.parallel, f"{at}.parallel"))
                    ids = [f"processor:{b.processor_id}" for b in branches]
                    items.append(
                        ParallelGroup(
                            key=f"workflow:{entry.workflow}/{j}",
                            processor_id=entry.workflow,
                            branches=branches,
                            pick=ids.index(step.map) if step.map else 0,
                        )
                    )
                elif isinstance(step, ConditionalStep):
                    items.append(
                        Conditional(
                            when=step.when,
                            then=tuple(self.resolve(step.then, f"{at}.then")),
                            otherwise=tuple(self.resolve(step.otherwise, f"{at}.otherwise")),
                        )
                    )
                else:
                    items.append(self._bind(step, at))
        return items

    def agent(self, agent_id: str) -> Agent:
        """The agent with this id."""
        try:
            return self.agents[agent_id]
        except KeyError:
            raise ConfigError(f"unknown agent {agent_id!r} (configured: {sorted(self.agents)})") from None

    async def stop(self) -> None:
        """Close every sidecar channel and MCP session; stop the built-in sidecar if this App started it."""
        if self.durable is not None:
            await self.durable.close()  # local runs stop unfinished: their leases move them
        await asyncio.gather(
            *(c.close() for c in self.clients.values()), self.models.aclose(), self.tools.close()
        )
        if self.events is not None:
            await self.events.close()
        if self.store is not None:
            await self.store.close()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self.builtins is not None:
            await asyncio.to_thread(self.builtins.stop)
        if self._builtins_dir is not None:
            shutil.rmtree(self._builtins_dir, ignore_errors=True)

    async def __aenter__(self) -> App:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
