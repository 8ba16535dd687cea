"""Composition root: the serving pipeline (`app._pipeline`), the built-in sidecar, the store and
durable runs, and the swap a reload makes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from procmesh import ProcessorClient
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator.app._pipeline import Pipeline
from procmesh_orchestrator.config import (
    BUILTINS,
    Config,
    LaneEntry,
    ProcessorRef,
    SidecarConfig,
    workflow_refs,
)
from procmesh_orchestrator.config.providers import DEFAULT_PROVIDERS
from procmesh_orchestrator.durable import DurableRuns, config_version
from procmesh_orchestrator.durable.events import EventLog, open_event_log
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.processors import LaneItem, ProcessorHandle
from procmesh_orchestrator.processors.binding import LaneBinder, LaneSource
from procmesh_orchestrator.providers import ModelRegistry
from procmesh_orchestrator.run import Agent, AgentSpec, RunResult, background, violation_routes
from procmesh_orchestrator.sidecar_metrics import MergedSidecarMetrics
from procmesh_orchestrator.sidecar_process import (
    ModelGateway,
    SidecarProcess,
    sidecar_environment,
    supervise,
)
from procmesh_orchestrator.store import MemoryStore, open_store
from procmesh_orchestrator.tools import ToolCatalog

log = logging.getLogger(__name__)

MAX_LIVE = 100_000
"""Runs `App.agent_of` keeps at most (a run ends and is forgotten; this bounds one that never did)."""


def secret_variables(config: Config) -> set[str]:
    """The variables the orchestrator reads a secret from: each provider's `apiKeyEnv` (the
    built-in providers' included), the store's `dsnEnv`, the event log's and the judge cache's Redis
    `urlEnv`, and its own API keys (``PROCMESH_API_KEYS``). A sidecar it starts gets none of them
    (`sidecar_environment`)."""
    providers = {**DEFAULT_PROVIDERS, **config.providers}
    names = {p.api_key_env for p in providers.values()}
    names |= {config.storage.dsn_env, config.durable.event_log.url_env, "PROCMESH_API_KEYS"}
    if config.judge_cache.redis is not None:
        names.add(config.judge_cache.redis.url_env)
    return {name for name in names if name}


def needs_builtins(config: Config) -> bool:
    """Whether an agent of `config` uses the built-in sidecar (a ``builtins/`` processor, or the
    default error processors)."""
    named = [
        r
        for a in config.agents.values()
        for _, lane in a.named_lanes()
        for r in lane
        if isinstance(r, ProcessorRef)
    ]
    named += [r for w in config.workflows.values() for step in w.steps for r in workflow_refs(step)]
    return any(a.error_processor_defaults for a in config.agents.values()) or any(
        r.sidecar == BUILTINS for r in named
    )


class App:
    """Everything the orchestrator runs: sidecar clients, models, tools and agents.

    Use as an async context manager: entering connects to every sidecar, calls
    `Describe` and fails with a clear `ConfigError` when a referenced processor
    is not hosted there. What one config binds is its `pipeline`; `swap()` puts a new,
    started one in its place (a reload) and retires the old one after its runs.
    """

    def __init__(
        self,
        config: Config,
        *,
        metrics: OrchestratorMetrics | None = None,
        connect_timeout: float = 10.0,
        lanes: Mapping[str, Mapping[str, LaneSource]] | None = None,
    ) -> None:
        self.metrics = metrics or OrchestratorMetrics()
        self.lanes = dict(lanes or {})
        """Lanes given as functions of the request context, by agent id and lane (``input``,
        ``output``): each returns the lane's entries as the config writes them, bound as each run
        starts (the seeds' ``inputProcessors: ({ requestContext }) => [...]``); every pipeline,
        a reload's included, takes them."""
        self.connect_timeout = connect_timeout
        """Seconds a sidecar (or the built-in one) has to answer at start and at a reload."""
        self.on_swap: list[Callable[[Pipeline], None]] = []
        """Called with the new pipeline right after each `swap` (what a Service derives from the
        config: the health poll's optional sidecars, the model gateway's models)."""
        self.run_ended: list[Callable[[str], object]] = []
        """Told each run's id as the run ends, however it started (generate with or without a
        ``runId``, stream, resume, durable): the model gateway cancels the run's judge questions
        still in flight (`service.grpc.run_judging`)."""
        self.attempt_failed: list[Callable[[str], object]] = []
        """Told a run's id when one of its model calls failed (its attempt is given up, whether
        the call is retried, falls back or ends the run): the model gateway cancels the judge
        questions the failed attempt's guards still have in flight (`service.grpc.run_judging`)."""
        self._failed_attempts: set[str] = set()
        """Runs whose model call failed and whose next attempt has not begun (`failed_attempt`)."""
        self._live: dict[str, str] = {}
        """The agent of each run in flight here, by run id (`agent_of`), however it started."""
        self.pipeline = Pipeline(
            config,
            self.metrics,
            connect_timeout=connect_timeout,
            lanes=self.lanes,
            ended=self.ended,
            failed=self.failed,
            began=self.began,
            started=self.started,
        )
        """The serving pipeline: the config's sidecars, tools, models and agents, bound."""
        self.clients: dict[str, ProcessorClient] = {}
        """The serving pipeline's sidecar channels (one dict, updated in place by `swap`)."""
        self.agents: dict[str, Agent] = {}
        """The serving pipeline's agents (one dict, updated in place by `swap`)."""
        self.builtins: SidecarProcess | None = None
        self._builtins_address: str | None = None
        self._builtins_dir: str | None = None
        self._builtins_metrics: MergedSidecarMetrics | None = None
        """The built-in sidecar's series, merged into this App's registry (`sidecar_metrics`)."""
        self._supervisor: asyncio.Task[None] | None = None
        self._gateway: ModelGateway | None = None
        self._retiring: dict[Pipeline, asyncio.Task[None]] = {}
        """Pipelines a reload replaced, each closed once its runs end."""
        self._durable_agents: dict[str, AgentSpec] = {}
        """The agents durable runs are started and taken over with (updated in place by `swap`)."""
        self.store: MemoryStore | None = None
        """The store (`Config.storage`): opened at start when an agent has memory, else when a run
        first suspends for a tool approval."""
        self._store_lock = asyncio.Lock()
        self.events: EventLog | None = None
        """Durable runs' event log (`Config.durable.eventLog`), when an agent is durable."""
        self.durable: DurableRuns | None = None
        """Durable runs of this replica and the take-over of others' (`durable` package)."""
        self.durable_ended: list[Callable[[str, RunResult], None]] = []
        """Told (agent id, result) of each durable run that ends on this replica, begun here or
        taken over (`DurableRuns.ended`; the service notes its model warnings so)."""
        self._durable_lock = asyncio.Lock()

    def started(self, run_id: str, agent_id: str) -> None:
        """A run of `agent_id` started here (its hook caller was made): `agent_of` knows it until
        it ends (the oldest forgotten past `MAX_LIVE`, should a run never end)."""
        self._live[run_id] = agent_id
        while len(self._live) > MAX_LIVE:
            self._live.pop(next(iter(self._live)))

    def agent_of(self, run_id: str) -> str | None:
        """The agent of the run in flight here by this id (generate, stream, resume, durable), or
        None: the judge planner reads its lanes."""
        return self._live.get(run_id) if run_id else None

    def ended(self, run_id: str) -> None:
        """A run of this App ended: tell each of `run_ended`."""
        self._failed_attempts.discard(run_id)
        self._live.pop(run_id, None)
        for ended in self.run_ended:
            ended(run_id)

    def failed(self, run_id: str) -> None:
        """A model call of a run of this App failed: tell each of `attempt_failed`. Until the
        run's next attempt begins (`began`) the run's attempt is a failed one (`failed_attempt`)."""
        self._failed_attempts.add(run_id)
        for failed in self.attempt_failed:
            failed(run_id)

    def began(self, run_id: str) -> None:
        """The run called a processor hook other than ``process_api_error`` (the failure's own
        hooks): a failed attempt's retry, fallback or next step has begun."""
        if self._failed_attempts:
            self._failed_attempts.discard(run_id)

    def failed_attempt(self, run_id: str) -> bool:
        """True between a failure of one of the run's model calls and its next attempt: whatever
        the run's guards ask now is about the failed attempt's text (the model gateway refuses
        it, as it cancels the questions in flight at the failure)."""
        return run_id in self._failed_attempts

    # -- the serving pipeline's parts, as App attributes ------------------------------------

    @property
    def config(self) -> Config:
        """The serving config."""
        return self.pipeline.config

    @property
    def version(self) -> str:
        """The serving config's version (`app._pipeline.config_hash`)."""
        return self.pipeline.version

    @property
    def sidecars(self) -> dict[str, SidecarConfig]:
        """The sidecars by name, the built-in one included when this App started it."""
        return self.pipeline.sidecars.sidecars

    @property
    def catalog(self) -> dict[str, dict[str, ppb.ProcessorInfo]]:
        """Each sidecar's processors (Describe), by id."""
        return self.pipeline.sidecars.processors

    @property
    def hosted_tools(self) -> dict[str, dict[str, ppb.HostedTool]]:
        """Each sidecar's hosted tools (Describe), by name."""
        return self.pipeline.sidecars.tools

    @property
    def fusing(self) -> set[str]:
        """The sidecars whose Describe says they run fused requests."""
        return self.pipeline.sidecars.fusing

    @property
    def binder(self) -> LaneBinder:
        """Binds lane entries to the serving pipeline's sidecars."""
        return self.pipeline.binder

    @property
    def models(self) -> ModelRegistry:
        """Models by reference: ``models`` keys, and ``provider/model-id`` created on first use."""
        return self.pipeline.models

    @property
    def tools(self) -> ToolCatalog:
        """The serving pipeline's tools."""
        return self.pipeline.tools

    # -- start, swap, stop -------------------------------------------------------------------

    async def _start_builtins(self, gateway: ModelGateway | None) -> None:
        """Start and supervise the built-in sidecar on a private unix socket (none was configured),
        without the provider keys and pointed at the model gateway (its guards judge through it)."""
        self._builtins_dir = tempfile.mkdtemp(prefix="procmesh-builtins-")
        os.chmod(self._builtins_dir, 0o700)
        address = f"unix://{os.path.join(self._builtins_dir, 'builtins.sock')}"
        log_path = os.path.join(self._builtins_dir, "builtins.log")
        self.builtins = SidecarProcess(
            # its metrics on an ephemeral loopback port it logs, merged into ours (sidecar_metrics)
            ["builtins", "--parent-pid", str(os.getpid()), "--metrics-port", "0"],
            address,
            log_path=log_path,
            env=sidecar_environment(os.environ, secret_variables(self.config), gateway),
        )
        self.builtins.start()
        self._builtins_address = address
        await self.builtins.wait_ready(self.connect_timeout)
        self._builtins_metrics = MergedSidecarMetrics(self.metrics, BUILTINS, log_path)
        self._builtins_metrics.start()
        # Restarted when it exits (clients reconnect by themselves), with crash-loop backoff.
        self._supervisor = asyncio.create_task(supervise(self.builtins, connect_timeout=self.connect_timeout))

    async def _with_builtins(self, pipeline: Pipeline) -> None:
        """Point `pipeline` at the built-in sidecar this App runs, started on first need."""
        if BUILTINS in pipeline.config.sidecars or not needs_builtins(pipeline.config):
            return
        if self.builtins is None:
            await self._start_builtins(self._gateway)
        assert self._builtins_address is not None
        pipeline.sidecars.sidecars[BUILTINS] = SidecarConfig(address=self._builtins_address)

    async def start_pipeline(self, pipeline: Pipeline) -> None:
        """Start `pipeline` against this App's built-in sidecar and store (ConfigError naming the
        key on anything start-up refuses; what it opened is closed then)."""
        try:
            cache = pipeline.config.judge_cache
            if cache.enabled and cache.redis is not None:
                cache.redis.redis_url()  # an unset urlEnv refuses the config now, not at the first judge call
            await self._with_builtins(pipeline)
            store = None
            if any(a.memory is not None for a in pipeline.config.agents.values()):
                store = await self._open_store()
            await pipeline.start(store=store, suspended_runs_store=self.suspended_runs_store)
        except BaseException:
            if pipeline is not self.pipeline:
                await pipeline.close()
            raise

    async def start(self, *, gateway: ModelGateway | None = None) -> None:
        """Connect to the sidecars (waiting up to the connect timeout) and build the agents.

        `gateway` is where a built-in sidecar this App starts reaches the model gateway (the
        Service's gRPC server; None: no gateway, its guards then fail to judge).
        """
        self._gateway = gateway
        await self.start_pipeline(self.pipeline)
        self._show(self.pipeline)
        self.metrics.config_serving(self.version)
        if any(a.durable for a in self.config.agents.values()):
            await self.durable_runs()

    def _show(self, pipeline: Pipeline) -> None:
        """Make `pipeline` the one the App's dicts show (no await: one step for every reader)."""
        self.clients.clear()
        self.clients.update(pipeline.sidecars.clients)
        self.agents.clear()
        self.agents.update(pipeline.agents)

    def swap(self, pipeline: Pipeline) -> Pipeline:
        """Serve the started `pipeline` from now on; the old one is retired (closed once its runs
        end) in the background. Returns the old one."""
        old, self.pipeline = self.pipeline, pipeline
        self._show(pipeline)
        self._durable_agents.clear()
        self._durable_agents.update({agent_id: agent.spec for agent_id, agent in pipeline.agents.items()})
        if self.durable is not None:
            self.durable.versions.clear()
            self.durable.versions.update(self._versions(pipeline))
        self.metrics.config_serving(pipeline.version, old.version)
        for listener in self.on_swap:
            listener(pipeline)
        task = asyncio.create_task(old.retire())
        self._retiring[old] = task
        task.add_done_callback(lambda _: self._retiring.pop(old, None))
        return old

    def _versions(self, pipeline: Pipeline) -> dict[str, str]:
        return {agent_id: config_version(pipeline.config.agents[agent_id]) for agent_id in pipeline.agents}

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
            self._durable_agents.update({agent_id: agent.spec for agent_id, agent in self.agents.items()})
            durable = DurableRuns(
                self.suspended_runs_store,
                events,
                self._durable_agents,
                self.metrics,
                self.config.durable,
                versions=self._versions(self.pipeline),
                ended=self.durable_ended,
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

    def resolve(
        self, refs: Sequence[LaneEntry | str | dict[str, Any]], where: str = "processors"
    ) -> list[ProcessorHandle]:
        """Bind processor references (``sidecar/id`` strings or ProcessorRef) to their sidecars."""
        return self.pipeline.binder.resolve(refs, where)

    def resolve_lane(self, entries: Sequence[LaneEntry | str], where: str) -> list[LaneItem]:
        """Bind a lane's entries; a ``workflow:NAME`` entry becomes its steps, in order."""
        return self.pipeline.binder.resolve_lane(entries, where)

    def agent(self, agent_id: str) -> Agent:
        """The agent with this id."""
        try:
            return self.agents[agent_id]
        except KeyError:
            raise ConfigError(f"unknown agent {agent_id!r} (configured: {sorted(self.agents)})") from None

    async def stop(self, *, drain: bool = True) -> None:
        """Deliver the violation webhooks in flight, close every sidecar channel and MCP session; stop the
        built-in sidecar if this App started it. `drain` False leaves the process's webhook posts and
        background calls alone (an App beside the serving one, as a replay's, has none of its own)."""
        if self.durable is not None:
            await self.durable.close()  # local runs stop unfinished: their leases move them
        if drain:
            await violation_routes.flush()  # a violation's webhook post in flight is delivered, not dropped
            await background.drain()  # a background tool call in flight lands and is stored, not dropped
        retired = list(self._retiring)  # their runs were drained or stopped: close them now
        for task in self._retiring.values():
            task.cancel()
        await asyncio.gather(*self._retiring.values(), return_exceptions=True)
        await asyncio.gather(*(p.close() for p in [*retired, self.pipeline]))
        if self.events is not None:
            await self.events.close()
        if self.store is not None:
            await self.store.close()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self._builtins_metrics is not None:
            await self._builtins_metrics.stop()
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
