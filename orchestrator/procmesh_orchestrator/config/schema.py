"""The configuration's schema: pydantic models whose validators name the key and the problem.

Keys follow the seeds' names (``inputProcessors``, ``maxProcessorRetries``, ...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.config.cost import PROCESSOR_NAMES as COST_NAMES
from procmesh_orchestrator.config.cost import SETTING_TAGS as SETTING_TAGS
from procmesh_orchestrator.config.cost import CostControlConfig as CostControlConfig
from procmesh_orchestrator.config.cost import PriceConfig as PriceConfig
from procmesh_orchestrator.config.cost import lane_cost_control
from procmesh_orchestrator.config.history import MessageHistoryConfig
from procmesh_orchestrator.config.judge_cache import JudgeCacheConfig
from procmesh_orchestrator.config.lanes import ConditionalStep as ConditionalStep
from procmesh_orchestrator.config.lanes import LaneByContext as LaneByContext
from procmesh_orchestrator.config.lanes import LaneEntry as LaneEntry
from procmesh_orchestrator.config.lanes import ParallelStep as ParallelStep
from procmesh_orchestrator.config.lanes import ProcessorRef as ProcessorRef
from procmesh_orchestrator.config.lanes import WorkflowConfig as WorkflowConfig
from procmesh_orchestrator.config.lanes import WorkflowRef as WorkflowRef
from procmesh_orchestrator.config.lanes import WorkflowStep as WorkflowStep
from procmesh_orchestrator.config.lanes import _lane, check_workflows, lane_instances, violation_routes
from procmesh_orchestrator.config.lanes import workflow_refs as workflow_refs
from procmesh_orchestrator.config.memory import WorkingMemoryConfig as WorkingMemoryConfig
from procmesh_orchestrator.config.recall import SemanticRecallConfig
from procmesh_orchestrator.config.request_context import SchemaOfContext
from procmesh_orchestrator.config.tools import FailurePolicy as FailurePolicy
from procmesh_orchestrator.config.tools import McpServerConfig as McpServerConfig
from procmesh_orchestrator.config.tools import ToolConfig as ToolConfig
from procmesh_orchestrator.durable.config import DurableConfig as DurableConfig
from procmesh_orchestrator.processors.decisions import DecisionsConfig
from procmesh_orchestrator.run import stop
from procmesh_orchestrator.store import StorageConfig

BUILTINS = "builtins"
"""The built-in sidecar's name: declare it to use your own; otherwise the orchestrator starts one."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class TLSConfig(_Model):
    """TLS to a sidecar: the CA that signed its certificate, and a client pair for mTLS."""

    ca: str
    """PEM file of the CA that signed the sidecar's certificate."""
    cert: str | None = None
    """PEM client certificate (mTLS)."""
    key: str | None = None
    """PEM client key (mTLS)."""
    server_name: str | None = None
    """Name to verify in the sidecar's certificate (default: the address's host)."""

    @model_validator(mode="after")
    def _pair(self) -> TLSConfig:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls.cert and tls.key go together (mTLS needs both)")
        return self


_ADDRESS_FORMS = "host:port, unix:///path.sock, dns:///name:port or ipv4:10.0.0.1:50051,10.0.0.2:50051"


def _host_port(entry: str, value: str) -> None:
    host, sep, port = entry.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"{value!r}: {entry!r} is not host:port (address must be {_ADDRESS_FORMS})")


def _check_target(value: str) -> None:
    """Each host:port of a ``dns:`` or ``ipv4:``/``ipv6:`` target (gRPC's naming) has a port."""
    scheme, _, rest = value.partition(":")
    if scheme == "dns":
        # dns:///name:port, dns://resolver:53/name:port (a chosen DNS server), or dns:name:port
        if rest.startswith("//"):
            rest = rest[2:].partition("/")[2]
        _host_port(rest, value)
        return
    entries = rest.split(",")
    for entry in entries:
        _host_port(entry, value)
        if scheme == "ipv6" and not entry.startswith("["):
            raise ValueError(f"{value!r}: write an ipv6 address in brackets, e.g. ipv6:[::1]:50051")


class SidecarConfig(_Model):
    """A sidecar process hosting processors."""

    address: str
    """``host:port``, ``unix:///path.sock``, ``dns:///name:port`` (every address the name resolves
    to, e.g. a headless Service) or ``ipv4:10.0.0.1:50051,10.0.0.2:50051`` (``ipv6:`` likewise):
    calls are balanced round-robin over the replicas."""
    timeout: float = Field(default=5.0, gt=0)
    """Seconds per hook call (the run's remaining deadline caps it); in an output stream, per
    part's answer and for the stream's end after the last part."""
    stream_timeout: float = Field(default=600.0, gt=0)
    """Seconds one output-stream session may stay open (the run's remaining deadline caps it);
    a session still open then is cut and the failure policy applies."""
    on_failure: FailurePolicy = "fail-closed"
    """What a failed call does to the run (processors may override)."""
    tls: TLSConfig | None = None
    """TLS/mTLS to this sidecar (plaintext when absent)."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value.startswith("unix:"):
            if len(value) <= len("unix://"):
                raise ValueError("unix address needs a path, e.g. unix:///run/procmesh/pii.sock")
        elif value.startswith(("dns:", "ipv4:", "ipv6:")):
            _check_target(value)
        elif ":" not in value:
            raise ValueError(f"address must be {_ADDRESS_FORMS}")
        return value


class ModelConfig(_Model):
    """A built-in model the agents may use: ``demo`` or ``scripted`` responses.

    HTTP models need no entry here: agents name them ``provider/model-id``.
    """

    provider: Literal["demo", "scripted"]
    responses: list[dict[str, Any]] = []
    """``scripted`` only: one response per model call (shapes: docs/configuration.md)."""
    delay_ms: float = Field(default=0.0, ge=0)
    """Pause between streamed deltas (demo pacing, benchmarks)."""
    specification_version: Literal["v2", "v3"] = "v2"
    """The model specification version the model reports (the reference's ``specificationVersion``:
    ``v2`` for AI SDK 5 providers, ``v3`` for AI SDK 6): part of ``response-cache`` keys."""


ProviderKind = Literal["openai", "anthropic"]

_DEFAULT_BASE_URLS: dict[str, str] = {
    "openai": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}


class ProviderConfig(_Model):
    """An HTTP model provider; agents name its models as ``provider/model-id``.

    The API key is read from the environment variable `api_key_env` when a
    model is used, never from the file.
    """

    kind: ProviderKind
    """Wire format: ``openai`` (chat completions: OpenAI, vLLM, Ollama, llama.cpp) or ``anthropic``."""
    base_url: str = Field(default="", validate_default=True)
    """API root, e.g. ``http://127.0.0.1:8080/v1``; default: the kind's public endpoint."""
    api_key_env: str | None = None
    """Environment variable holding the key; unset for local servers that need none."""
    max_retries: int = Field(default=0, ge=0)
    """Provider-level retries of retryable failures before any chunk arrived (0: the error
    processors, e.g. ``stream-error-retry-processor``, decide)."""
    retry_backoff_ms: float = Field(default=500.0, ge=0)
    """First backoff; doubles per retry (a longer Retry-After wins)."""
    timeout: float = Field(default=60.0, gt=0)
    """Seconds for connecting and between received bytes."""
    max_tokens: int | None = Field(default=None, gt=0)
    """Output token limit sent with each request (anthropic requires one: default 4096)."""
    specification_version: Literal["v2", "v3"] = "v2"
    """The model specification version the model reports (the reference's ``specificationVersion``:
    ``v2`` for AI SDK 5 providers, ``v3`` for AI SDK 6): part of ``response-cache`` keys."""
    download_max_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
    """Largest attachment the provider downloads for a model that cannot fetch its URL."""
    download_timeout: float = Field(default=30.0, gt=0)
    """Seconds one attachment download may take, redirects included."""
    download_allow_hosts: list[str] = []
    """Internal hosts attachments may be downloaded from: host names or networks (``10.2.0.0/16``,
    ``127.0.0.1``). Without them only public addresses are fetched (a caller's URL must not reach
    the pod's network)."""

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str, info: ValidationInfo) -> str:
        value = value or _DEFAULT_BASE_URLS.get(info.data.get("kind", ""), "")
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"baseUrl must start with http:// or https://, got {value!r}")
        return value.rstrip("/")


DEFAULT_PROVIDERS: dict[str, ProviderConfig] = {
    "openai": ProviderConfig(kind="openai", api_key_env="OPENAI_API_KEY"),
    "anthropic": ProviderConfig(kind="anthropic", api_key_env="ANTHROPIC_API_KEY"),
}
"""Providers usable without declaring them (a declared provider of the same name wins)."""


class AgentMemoryConfig(_Model):
    """An agent's message-history memory (a call with a thread loads and saves; docs/configuration.md)."""

    last_messages: int = Field(default=10, ge=1)
    """How many of the thread's most recent stored messages each call loads ahead of its input."""
    semantic_recall: SemanticRecallConfig | None = None
    """Recall of older messages like the caller's by their embeddings (none: the window only)."""
    working_memory: WorkingMemoryConfig | None = None
    """A text the model keeps about the resource or the thread (`config.memory`)."""
    read_only: bool = False
    """Load history and working memory, never write them (the reference's ``readOnly``)."""
    message_history: MessageHistoryConfig | None = None
    """A token budget on the call's context; only loaded history is cut, oldest first
    (the reference's ``messageHistory``). Without ``lastMessages`` it replaces the window."""


class ModelChoice(_Model):
    """One model of an agent's ordered list (the reference's ``model: [{model, maxRetries, enabled}]``)."""

    model: str
    max_retries: int = Field(default=0, ge=0)
    """Retries of this model's retryable failures before any chunk arrived, before the next model."""
    enabled: bool = True


class AgentConfig(_Model):
    """An agent: instructions, model, tools, processor lanes and limits."""

    instructions: str = ""
    model: str
    """The model: a reference, or (from a list in the file) the first enabled one of `model_list`."""
    model_list: list[ModelChoice] = Field(default=[], exclude=True)
    """The models in order, when the file gives ``model`` as a list: when a call fails and the error
    processors do not recover it, the next enabled model gets its turn."""
    cost_control: CostControlConfig | None = None
    """A spending limit for this agent's model calls (judge calls of its processors included): the
    same as a ``token-cost-control`` entry at the end of `input_processors` (`cost_limit`)."""
    tools: list[str] = []
    mcp_servers: list[str] = []
    """MCP servers (`mcpServers` keys) whose every tool the agent takes, under the server's names."""
    max_steps: int = Field(default=5, ge=1)
    tool_call_concurrency: int = Field(default=10, ge=1)
    """How many tool calls of one model step run at once (the reference's default, 10); their
    results still come in the order the model called them. 1 runs them one by one."""
    stop_when: list[dict[str, Any]] = []
    """End the loop after a step when any holds: ``{stepCountIs: n}``, ``{hasToolCall: name}``."""
    max_processor_retries: int | None = Field(default=None, ge=0)
    error_processor_defaults: bool = True
    input_processors: list[LaneEntry] = []
    output_processors: list[LaneEntry] = []
    error_processors: list[ProcessorRef] = []
    input_processors_by_context: LaneByContext | None = None
    """The input lane chosen per call from the request context, instead of `input_processors`."""
    output_processors_by_context: LaneByContext | None = None
    """The output lane chosen per call from the request context, instead of `output_processors`."""
    request_context_schema: SchemaOfContext | None = None
    """JSON Schema of the request context the agent accepts (`config.request_context`): checked
    before any processor of a run is called; keys it does not declare are refused."""
    memory: AgentMemoryConfig | None = None
    """Message history in threads of the `storage` store (none: every call stands alone)."""
    durable: bool = False
    """Every call is a durable run (checkpointed, taken over by another replica; see `durable`)."""
    fuse: bool | None = None
    """Neighbouring processors of one sidecar go in one request (default: the top-level `fuse`)."""
    record_inputs: bool = False
    """Keep what each run was given for replay: its input, request context, raw model output and
    tool results (with `decisions.record`; bounded by `decisions.maxInputBytes`)."""
    optimistic_first_step: bool = False
    """The first model call starts while the input processors still run; nothing of it reaches
    the caller, and no tool runs, before they all committed (a block cancels it, a rewrite
    restarts it on the committed input)."""
    _lane_cost: CostControlConfig | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _model_list(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("model"), list):
            return data
        entries = data["model"]
        if not entries:
            raise ValueError("model: give a model, or a non-empty list of {model, maxRetries, enabled}")
        choices = [ModelChoice.model_validate(e) for e in entries]
        enabled = [c for c in choices if c.enabled]
        if not enabled:
            raise ValueError("model: every model of the list is disabled (enable at least one)")
        return {**data, "model": enabled[0].model, "model_list": enabled}

    @field_validator("input_processors", "output_processors", "error_processors", mode="before")
    @classmethod
    def _refs(cls, value: Any) -> Any:
        return _lane(value)

    @model_validator(mode="after")
    def _one_kind_of_lane(self) -> AgentConfig:
        for lane in ("input_processors", "output_processors"):
            if getattr(self, lane) and getattr(self, f"{lane}_by_context") is not None:
                raise ValueError(
                    f"give {to_camel(lane)} or {to_camel(lane)}ByContext, not both "
                    "(the lane chosen from the request context replaces the static one)"
                )
        return self

    @model_validator(mode="after")
    def _cost_entry(self) -> AgentConfig:
        entry = lane_cost_control(list(self.input_processors), "inputProcessors")
        if entry is not None and self.cost_control is not None:
            raise ValueError(
                f"give costControl or a token-cost-control entry (inputProcessors.{entry[0]}), not both "
                "(costControl is that entry placed last)"
            )
        self._lane_cost = None if entry is None else entry[1]
        return self

    @property
    def cost_limit(self) -> CostControlConfig | None:
        """The agent's spending limit: its ``token-cost-control`` entry's, or `cost_control`'s."""
        return self.cost_control or self._lane_cost

    def possible_entries(self, lane: Literal["input", "output"]) -> list[LaneEntry]:
        """The entries a call of this lane may get: the static list, or every entry of each case
        and the default of the lane chosen from the request context (listings, catalogs)."""
        chosen: LaneByContext | None = getattr(self, f"{lane}_processors_by_context")
        if chosen is None:
            return list(getattr(self, f"{lane}_processors"))
        return [entry for _, entries in chosen.lanes() for entry in entries]

    def lane_candidates(self, prefix: str = "") -> dict[str, list[tuple[str, list[LaneEntry]]]]:
        """Per lane kind, every list a call of that kind may get, with its place in the config
        (after `prefix`, e.g. ``agents.ID.``)."""
        out: dict[str, list[tuple[str, list[LaneEntry]]]] = {}
        for lane in ("input_processors", "output_processors", "error_processors"):
            chosen: LaneByContext | None = getattr(self, f"{lane}_by_context", None)
            out[lane] = (
                [(f"{prefix}{to_camel(lane)}", list(getattr(self, lane)))]
                if chosen is None
                else [
                    (f"{prefix}{to_camel(lane)}ByContext.{where}", lane_list)
                    for where, lane_list in chosen.lanes()
                ]
            )
        return out

    def named_lanes(self) -> list[tuple[str, list[LaneEntry]]]:
        """Every lane list of the agent with its place in the config: the static lanes and each
        case and default of a lane chosen from the request context."""
        out: list[tuple[str, list[LaneEntry]]] = [
            (to_camel(lane), list(getattr(self, lane)))
            for lane in ("input_processors", "output_processors", "error_processors")
        ]
        for lane in ("input_processors_by_context", "output_processors_by_context"):
            chosen: LaneByContext | None = getattr(self, lane)
            if chosen is not None:
                out += [(f"{to_camel(lane)}.{where}", entries) for where, entries in chosen.lanes()]
        return out

    @property
    def models(self) -> list[ModelChoice]:
        """The enabled models in order (the one `model` when no list was given)."""
        return list(self.model_list) or [ModelChoice(model=self.model)]

    @field_validator("stop_when")
    @classmethod
    def _stop_when(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        stop.parse(value)  # a clear error for what is not a condition
        return value


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
