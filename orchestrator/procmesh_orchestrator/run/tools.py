"""Tools the agent loop can execute."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from procmesh_orchestrator.config import ToolConfig

Writer = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class StaticTool:
    """A tool that returns a configured result (and may emit one data chunk first)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    result: Any
    custom: dict[str, Any] | None = None

    @classmethod
    def from_config(cls, name: str, config: ToolConfig) -> StaticTool:
        """Build from a config entry."""
        return cls(name, config.description, config.input_schema, config.result, config.custom)

    def spec(self) -> dict[str, Any]:
        """What the model sees of the tool."""
        return {"name": self.name, "description": self.description, "inputSchema": self.input_schema}

    async def execute(self, args: Any, writer: Writer) -> Any:
        """Run the tool: emit its data chunk, if any, then return its result."""
        if self.custom is not None:
            await writer({"type": self.custom["type"], "data": self.custom.get("data")})
        return self.result
