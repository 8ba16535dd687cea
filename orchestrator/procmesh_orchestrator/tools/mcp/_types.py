"""The MCP client's plain values: how to reach a server, its tools, a call's result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class McpServerConfig:
    """How to reach one MCP server: `command` (stdio) or `url` (streamable HTTP), never both."""

    name: str
    command: list[str] | None = None
    """stdio: the server's argv; the process gets the SDK's safe default environment plus `env`."""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    """Streamable HTTP: the endpoint, e.g. ``http://127.0.0.1:8000/mcp``."""
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = 30.0
    """Seconds for start-up (connect + initialize) and for each call."""

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"MCP server {self.name!r}: set exactly one of command and url")
        if self.command is not None and not self.command:
            raise ValueError(f"MCP server {self.name!r}: command is empty")


@dataclass(frozen=True)
class McpTool:
    """A tool as the server lists it."""

    server: str
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class McpResult:
    """A tool's answer: `content` is the JSON the model sees, `is_error` the server's isError."""

    content: Any
    is_error: bool
