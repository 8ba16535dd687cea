"""The orchestrator's YAML configuration, validated by pydantic (errors name the key).

Keys follow the seeds' names (``inputProcessors``, ``maxProcessorRetries``, ...).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from orchestrator.errors import ConfigError

FailurePolicy = Literal["fail-closed", "fail-open"]
BUILTINS = "builtins"
"""The built-in sidecar's name: declare it to use your own; otherwise the orchestrator starts one."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class SidecarConfig(_Model):
    """A sidecar process hosting processors."""

    address: str
    """``host:port`` or ``unix:///path.sock``."""
    timeout: float = Field(default=5.0, gt=0)
    """Seconds per hook call (the run's remaining deadline caps it)."""
    on_failure: FailurePolicy = "fail-closed"
    """What a failed call does to the run (processors may override)."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value.startswith("unix:"):
            if len(value) <= len("unix://"):
                raise ValueError("unix address needs a path, e.g. unix:///run/procmesh/pii.sock")
        elif ":" not in value:
            raise ValueError("address must be host:port or unix:///path.sock")
        return value


class ProcessorRef(_Model):
    """A lane entry: ``sidecar/processor-id`` plus per-agent options and policy."""

    processor: str
    options: dict[str, Any] = {}
    timeout: float | None = Field(default=None, gt=0)
    on_failure: FailurePolicy | None = None

    @field_validator("processor")
    @classmethod
    def _shape(cls, value: str) -> str:
        sidecar, _, pid = value.partition("/")
        if not sidecar or not pid:
            raise ValueError(f"expected 'sidecar/processor-id', got {value!r}")
        return value

    @property
    def sidecar(self) -> str:
        """The sidecar's name."""
        return self.processor.partition("/")[0]

    @property
    def processor_id(self) -> str:
        """The processor's id on that sidecar."""
        return self.processor.partition("/")[2]


def _ref(value: Any) -> Any:
    return {"processor": value} if isinstance(value, str) else value


class ModelConfig(_Model):
    """A model the agents may use: the built-in ``demo`` or ``scripted`` responses."""

    provider: Literal["demo", "scripted"]
    responses: list[dict[str, Any]] = []
    """``scripted`` only: one response per model call (see docs/configuration.md)."""
    delay_ms: float = Field(default=0.0, ge=0)
    """Pause between streamed deltas (demo pacing, benchmarks)."""


class ToolConfig(_Model):
    """A tool with a fixed result (real tools arrive with the tool sidecars)."""

    description: str = ""
    input_schema: dict[str, Any] = {}
    result: Any = None
    custom: dict[str, Any] | None = None
    """A ``data-*`` chunk the tool emits with its writer before returning."""


class AgentConfig(_Model):
    """An agent: instructions, model, tools, processor lanes and limits."""

    instructions: str = ""
    model: str
    tools: list[str] = []
    max_steps: int = Field(default=5, ge=1)
    max_processor_retries: int | None = Field(default=None, ge=0)
    error_processor_defaults: bool = True
    input_processors: list[ProcessorRef] = []
    output_processors: list[ProcessorRef] = []
    error_processors: list[ProcessorRef] = []

    @field_validator("input_processors", "output_processors", "error_processors", mode="before")
    @classmethod
    def _refs(cls, value: Any) -> Any:
        return [_ref(v) for v in value] if isinstance(value, list) else value


class Config(_Model):
    """The whole orchestrator configuration."""

    sidecars: dict[str, SidecarConfig] = {}
    models: dict[str, ModelConfig] = {"demo": ModelConfig(provider="demo")}
    tools: dict[str, ToolConfig] = {}
    agents: dict[str, AgentConfig]

    @model_validator(mode="after")
    def _references(self) -> Config:
        for agent_id, agent in self.agents.items():
            if agent.model not in self.models:
                raise ValueError(f"agents.{agent_id}.model: unknown model {agent.model!r}")
            for tool in agent.tools:
                if tool not in self.tools:
                    raise ValueError(f"agents.{agent_id}.tools: unknown tool {tool!r}")
            for lane in ("input_processors", "output_processors", "error_processors"):
                for i, ref in enumerate(getattr(agent, lane)):
                    if ref.sidecar not in self.sidecars and ref.sidecar != BUILTINS:
                        raise ValueError(
                            f"agents.{agent_id}.{to_camel(lane)}.{i}: unknown sidecar {ref.sidecar!r} "
                            f"(declared: {sorted(self.sidecars)})"
                        )
        return self


def parse_config(data: Any, source: str = "config") -> Config:
    """Validate a config mapping; errors name the key path and the problem."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            lines.append(f"  {where}: {err['msg']}")
        raise ConfigError(f"invalid {source}:\n" + "\n".join(lines)) from None


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} must be a mapping at the top level")
    return parse_config(data, str(path))
