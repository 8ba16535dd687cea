"""The configuration as a whole (`Config`): its sections, and the checks that span them (every
model, tool, workflow and sidecar an agent names is declared).

Keys follow the seeds' names (``inputProcessors``, ``maxProcessorRetries``, ...). Each section's
models live in the module of its concern: agents.py, sidecars.py, providers.py, lanes.py,
tools.py, cost.py.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.config.agents import AgentConfig
from procmesh_orchestrator.config.cost import PROCESSOR_NAMES as COST_NAMES
from procmesh_orchestrator.config.cost import PriceConfig
from procmesh_orchestrator.config.judge_cache import JudgeCacheConfig
from procmesh_orchestrator.config.lanes import (
    ProcessorRef,
    WorkflowConfig,
    WorkflowRef,
    check_workflows,
    lane_instances,
    violation_routes,
    workflow_refs,
)
from procmesh_orchestrator.config.providers import DEFAULT_PROVIDERS, ModelConfig, ProviderConfig
from procmesh_orchestrator.config.sidecars import BUILTINS, SidecarConfig
from procmesh_orchestrator.config.tools import McpServerConfig, ToolConfig
from procmesh_orchestrator.durable.config import DurableConfig
from procmesh_orchestrator.processors.decisions import DecisionsConfig
from procmesh_orchestrator.store import StorageConfig


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class Config(_Model):
    """The whole orchestrator configuration."""

    sidecars: dict[str, SidecarConfig] = {}
    providers: dict[str, ProviderConfig] = {}
    """HTTP providers by name; ``openai`` and ``anthropic`` exist by default (see DEFAULT_PROVIDERS)."""
    models: dict[str, ModelConfig] = {"demo": ModelConfig(provider="demo")}
    tools: dict[str, ToolConfig] = {}
    mcp_servers: dict[str, McpServerConfig] = {}
    """MCP servers whose tools agents take (`tools.*.mcp`, `agents.*.mcpServers`)."""
    workflows: dict[str, WorkflowConfig] = {}
    """Processor workflows, used in a lane as ``workflow:NAME``."""
    agents: dict[str, AgentConfig]
    storage: StorageConfig = StorageConfig()
    """The store agents' memory, suspended runs, durable runs and cost usage use (opened when needed)."""
    prices: dict[str, PriceConfig] = {}
    """Model prices by model reference (a `models` key or ``provider/model-id``), for `costControl`."""
    durable: DurableConfig = DurableConfig()
    """Durable runs' leases and event log (used when an agent or a call is durable)."""
    fuse: bool = True
    """Neighbouring processors of a sidecar whose Describe says ``fuses`` go in one request
    (agents may override it)."""
    decisions: DecisionsConfig = DecisionsConfig()
    """Every run's processor decisions kept in the `storage` store (off unless ``record``)."""
    judge_cache: JudgeCacheConfig = JudgeCacheConfig()
    """The model gateway's cache of judge verdicts (off unless ``enabled``)."""

    @field_validator("providers")
    @classmethod
    def _provider_names(cls, value: dict[str, ProviderConfig]) -> dict[str, ProviderConfig]:
        for name in value:
            if not name or "/" in name:
                raise ValueError(f"provider name {name!r} must be non-empty and contain no '/'")
        return value

    def provider(self, name: str) -> ProviderConfig | None:
        """The provider called `name`: declared, else a default one, else None."""
        return self.providers.get(name) or DEFAULT_PROVIDERS.get(name)

    def model_problem(self, ref: str) -> str | None:
        """Why `ref` names no model (None when it does): a `models` key or ``provider/model-id``."""
        if ref in self.models:
            return None
        provider, sep, model_id = ref.partition("/")
        if not sep or not provider or not model_id:
            return (
                f"unknown model {ref!r} (models: {sorted(self.models)}; "
                "or name a provider model as 'provider/model-id')"
            )
        if self.provider(provider) is None:
            declared = sorted({*self.providers, *DEFAULT_PROVIDERS})
            return f"unknown provider {provider!r} in {ref!r} (providers: {declared})"
        return None

    @model_validator(mode="after")
    def _recording(self) -> Config:
        recording = sorted(a for a, agent in self.agents.items() if agent.record_inputs)
        if recording and not self.decisions.record:
            raise ValueError(f"agents {recording} set recordInputs, which needs decisions.record: true")
        return self

    @model_validator(mode="after")
    def _switched_off(self) -> Config:
        # a section's settings shape what its switch turns on: given with it off, nothing reads them
        for name, section, switch in (
            ("decisions", self.decisions, "record"),
            ("judgeCache", self.judge_cache, "enabled"),
        ):
            given = sorted(f"{name}.{to_camel(key)}" for key in section.model_fields_set - {switch})
            if given and not getattr(section, switch):
                them = "it" if len(given) == 1 else "them"
                raise ValueError(
                    f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} nothing without "
                    f"{name}.{switch}: true (set {name}.{switch}: true, or leave {them} out)"
                )
        return self

    @model_validator(mode="after")
    def _references(self) -> Config:
        check_workflows(self.workflows)
        for agent_id, agent in self.agents.items():
            for choice in agent.models:
                problem = self.model_problem(choice.model)
                if problem is not None:
                    raise ValueError(f"agents.{agent_id}.model: {problem}")
                if agent.cost_limit is not None and choice.model not in self.prices:
                    raise ValueError(
                        f"agents.{agent_id}.{'costControl' if agent.cost_control else 'token-cost-control'}: "
                        f"model {choice.model!r} has no price "
                        f"(add prices.{choice.model}: {{input, output}} per million tokens)"
                    )
            self._check_embedder(agent_id, agent)
            for tool in agent.tools:
                if tool not in self.tools:
                    raise ValueError(f"agents.{agent_id}.tools: unknown tool {tool!r}")
            for server in agent.mcp_servers:
                if server not in self.mcp_servers:
                    raise ValueError(
                        f"agents.{agent_id}.mcpServers: unknown MCP server {server!r} "
                        f"(declared: {sorted(self.mcp_servers)})"
                    )
            lane_instances(agent.lane_candidates(f"agents.{agent_id}."), self.workflows)
            violation_routes(agent.lane_candidates(f"agents.{agent_id}."), self.workflows)
            for lane, entries in agent.named_lanes():
                for i, ref in enumerate(entries):
                    if isinstance(ref, WorkflowRef):
                        if ref.workflow not in self.workflows:
                            raise ValueError(
                                f"agents.{agent_id}.{lane}.{i}: unknown workflow {ref.workflow!r} "
                                f"(declared: {sorted(self.workflows)})"
                            )
                        continue
                    if lane == "inputProcessors" and ref.processor in COST_NAMES:
                        continue  # the orchestrator's own (AgentConfig._cost_entry)
                    self._check_sidecar(ref, f"agents.{agent_id}.{lane}.{i}")
        for name, cfg in self.tools.items():
            if cfg.sidecar and cfg.sidecar not in self.sidecars:
                declared = sorted(self.sidecars)
                raise ValueError(
                    f"tools.{name}.sidecar: unknown sidecar {cfg.sidecar!r} (declared: {declared})"
                )
            if cfg.mcp and cfg.mcp not in self.mcp_servers:
                declared = sorted(self.mcp_servers)
                raise ValueError(f"tools.{name}.mcp: unknown MCP server {cfg.mcp!r} (declared: {declared})")
        for name, workflow in self.workflows.items():
            for i, step in enumerate(workflow.steps):
                for ref in workflow_refs(step):
                    self._check_sidecar(ref, f"workflows.{name}.steps.{i}")
        return self

    def _check_embedder(self, agent_id: str, agent: AgentConfig) -> None:
        recall = agent.memory.semantic_recall if agent.memory else None
        if recall is None:
            return
        where = f"agents.{agent_id}.memory.semanticRecall.embedder"
        problem = self.model_problem(recall.embedder)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")
        provider = self.provider(recall.embedder.partition("/")[0])
        if recall.embedder in self.models or provider is None or provider.kind != "openai":
            raise ValueError(f"{where}: an embedder is a model of an 'openai'-kind provider (/embeddings)")

    def _check_sidecar(self, ref: ProcessorRef, where: str) -> None:
        if ref.processor in COST_NAMES:
            raise ValueError(
                f"{where}: {ref.processor} goes in an agent's inputProcessors (one per agent); "
                "its maxCost and scope may come from the request context instead"
            )
        if ref.sidecar not in self.sidecars and ref.sidecar != BUILTINS:
            raise ValueError(f"{where}: unknown sidecar {ref.sidecar!r} (declared: {sorted(self.sidecars)})")
