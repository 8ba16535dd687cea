"""An agent in the configuration (``agents.ID``): its instructions, models, tools, processor lanes,
memory and limits."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.config.cost import CostControlConfig, lane_cost_control
from procmesh_orchestrator.config.history import MessageHistoryConfig
from procmesh_orchestrator.config.lanes import LaneByContext, LaneEntry, ProcessorRef, _lane
from procmesh_orchestrator.config.memory import WorkingMemoryConfig
from procmesh_orchestrator.config.recall import SemanticRecallConfig
from procmesh_orchestrator.config.request_context import SchemaOfContext
from procmesh_orchestrator.run import stop


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


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
