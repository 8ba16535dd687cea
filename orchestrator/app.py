"""Composition root: connects to the sidecars, checks what they host, builds the agents."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from orchestrator.agent import Agent, AgentSpec, Lanes
from orchestrator.config import Config, ProcessorRef
from orchestrator.errors import ConfigError
from orchestrator.metrics import OrchestratorMetrics
from orchestrator.models import ModelProvider, make_model
from orchestrator.processors import HOOK_BY_ENUM, ProcessorHandle
from orchestrator.tools import StaticTool
from procmesh import ProcessorClient, convert
from procmesh.errors import ProcmeshError
from procmesh.v1 import processor_pb2 as ppb

log = logging.getLogger(__name__)


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
        self.models: dict[str, ModelProvider] = {
            name: make_model(name, m) for name, m in config.models.items()
        }
        self.tools = {name: StaticTool.from_config(name, t) for name, t in config.tools.items()}
        self.agents: dict[str, Agent] = {}
        self._connect_timeout = connect_timeout

    async def start(self) -> None:
        """Connect to the sidecars (waiting up to the connect timeout) and build the agents."""
        for name, sidecar in self.config.sidecars.items():
            self.clients[name] = ProcessorClient(sidecar.address)
        await asyncio.gather(*(self._describe(name) for name in self.clients))
        for agent_id, agent in self.config.agents.items():
            spec = AgentSpec(
                id=agent_id,
                model=self.models[agent.model],
                instructions=agent.instructions,
                models=self.models,
                tools={t: self.tools[t] for t in agent.tools},
                max_steps=agent.max_steps,
                max_processor_retries=agent.max_processor_retries,
                lanes=Lanes(
                    input=tuple(self.resolve(agent.input_processors, f"agents.{agent_id}.inputProcessors")),
                    output=tuple(
                        self.resolve(agent.output_processors, f"agents.{agent_id}.outputProcessors")
                    ),
                    error=tuple(self.resolve(agent.error_processors, f"agents.{agent_id}.errorProcessors")),
                ),
                error_defaults=agent.error_processor_defaults,
            )
            self.agents[agent_id] = Agent(spec, self.metrics)

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

    def resolve(
        self, refs: Sequence[ProcessorRef | str | dict[str, Any]], where: str = "processors"
    ) -> list[ProcessorHandle]:
        """Bind lane entries (``sidecar/id`` strings or ProcessorRef) to their sidecars."""
        handles = []
        for i, raw in enumerate(refs):
            ref = (
                raw
                if isinstance(raw, ProcessorRef)
                else ProcessorRef.model_validate({"processor": raw} if isinstance(raw, str) else raw)
            )
            sidecar = self.config.sidecars.get(ref.sidecar)
            hosted = self.catalog.get(ref.sidecar)
            if sidecar is None or hosted is None:
                raise ConfigError(f"{where}.{i}: unknown or unconnected sidecar {ref.sidecar!r}")
            info = hosted.get(ref.processor_id)
            if info is None:
                raise ConfigError(
                    f"{where}.{i}: sidecar {ref.sidecar!r} does not host processor "
                    f"{ref.processor_id!r} (it hosts {sorted(hosted)})"
                )
            handles.append(
                ProcessorHandle(
                    key=ref.processor,
                    processor_id=ref.processor_id,
                    client=self.clients[ref.sidecar],
                    options=convert.to_struct(ref.options),
                    hooks=frozenset(HOOK_BY_ENUM[h] for h in info.hooks if h in HOOK_BY_ENUM),
                    process_data_parts=info.process_data_parts,
                    timeout=ref.timeout or sidecar.timeout,
                    on_failure=ref.on_failure or sidecar.on_failure,
                )
            )
        return handles

    def agent(self, agent_id: str) -> Agent:
        """The agent with this id."""
        try:
            return self.agents[agent_id]
        except KeyError:
            raise ConfigError(f"unknown agent {agent_id!r} (configured: {sorted(self.agents)})") from None

    async def stop(self) -> None:
        """Close every sidecar channel."""
        await asyncio.gather(*(c.close() for c in self.clients.values()))

    async def __aenter__(self) -> App:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
