"""The configuration of agents' tools: fixed results, tools a sidecar hosts, MCP servers' tools."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

FailurePolicy = Literal["fail-closed", "fail-open"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class BackgroundConfig(_Model):
    """The tool runs in the background, detached from the step (`run.background`): the reference's
    tool ``background`` config, with its defaults."""

    disposition: Literal["deferred", "awaited"] = "deferred"
    """deferred: the model gets a placeholder at once and the run goes on; awaited: the step waits
    for the result."""
    timeout: float = Field(default=300.0, gt=0)
    """Seconds for each attempt."""
    max_retries: int = Field(default=0, ge=0)
    """Attempts after a failed one."""
    retry_delay: float = Field(default=1.0, ge=0)
    """Seconds before the first retry, doubled for each next one (at most 30 s)."""


class CustomChunkConfig(_Model):
    """A fixed-result tool's ``custom``: the ``data-*`` chunk it emits, ``{type, data}``."""

    type: str = Field(pattern=r"^data-.+")
    data: Any = None


class ToolConfig(_Model):
    """A tool: a fixed `result`, one a sidecar hosts (`sidecar`), or an MCP server's (`mcp`).

    A sidecar's or MCP server's tool takes its description and input schema from there (Describe,
    tools/list) unless given here.
    """

    description: str = ""
    input_schema: dict[str, Any] = {}
    result: Any = None
    custom: dict[str, Any] | None = None
    """A ``data-*`` chunk the tool emits with its writer before returning (fixed-result tools)."""
    sidecar: str | None = None
    """The sidecar (a `sidecars` key) that hosts the tool."""
    mcp: str | None = None
    """The MCP server (an `mcpServers` key) that has the tool."""
    tool: str | None = None
    """The tool's name there, when it differs from this key."""
    timeout: float | None = Field(default=None, gt=0)
    """Seconds per call (default: the sidecar's timeout, or the MCP server's)."""
    on_failure: FailurePolicy | None = None
    """When the sidecar or server fails: end the run (fail-closed, the sidecar's default) or tell
    the model the tool is unavailable (fail-open)."""
    require_approval: bool = False
    """Each call waits for a decision (approve / decline); the run suspends meanwhile."""
    background: BackgroundConfig | None = None
    """Run each call in the background (absent: in the step, the foreground)."""

    @field_validator("custom")
    @classmethod
    def _custom(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None:
            CustomChunkConfig.model_validate(value)  # {type: data-*, data}: no other key
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> ToolConfig:
        if self.sidecar and self.mcp:
            raise ValueError("a tool has either `sidecar` or `mcp`, not both")
        remote = self.sidecar or self.mcp
        if remote and (self.result is not None or self.custom is not None):
            raise ValueError("`result` and `custom` are for fixed-result tools only")
        if not remote and (self.tool or self.timeout or self.on_failure):
            raise ValueError("`tool`, `timeout` and `onFailure` need `sidecar` or `mcp`")
        return self


class McpServerConfig(_Model):
    """A Model Context Protocol server: started over stdio (`command`) or reached at `url`."""

    command: list[str] | None = None
    """stdio: the server's argv (the orchestrator starts it and stops it at shutdown)."""
    env: dict[str, str] = {}
    cwd: str | None = None
    url: str | None = None
    """Streamable HTTP: the server's endpoint."""
    headers: dict[str, str] = {}
    timeout: float = Field(default=30.0, gt=0)
    """Seconds for start-up and per call."""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError("an MCP server has exactly one of `command` (stdio) and `url` (streamable HTTP)")
        # a key of the other transport would never be read (headers not sent, env not set)
        other = ("headers",) if self.command else ("env", "cwd")
        if ignored := [name for name in other if getattr(self, name)]:
            transport = "stdio (`command`)" if self.command else "streamable HTTP (`url`)"
            raise ValueError(f"{', '.join(ignored)}: not read by a {transport} MCP server")
        return self
