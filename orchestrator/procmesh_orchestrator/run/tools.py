"""The tools a run can call: what the model sees of each, how its arguments are checked, how it runs.

Every tool goes through one path (`run.tool_calls`): arguments validated against the tool's
JSON schema, approval when it requires one, then `execute`. A tool's own failure is data (an
`error` the model sees, a ``tool-error`` chunk); only a fail-closed sidecar failure ends the run.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import jsonschema

from procmesh_orchestrator.run.hooks import Effects, ExecuteToolArgs, Processor, Resumed, Suspension

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

Writer = Callable[[dict[str, Any]], Awaitable[None]]
"""Where a tool's ``data-*`` chunks go while it runs."""

_MAX_ARGS_IN_ERROR = 500


@dataclass(frozen=True)
class ToolCall:
    """One call the model made."""

    call_id: str
    name: str
    args: Any
    resumed: Resumed | None = None
    """Set when the call suspended itself before and the caller resumed it with data."""


@dataclass(frozen=True)
class ToolOutcome:
    """What a call produced: a result, or an error the model sees instead (the tool failed)."""

    result: Any = None
    error: str | None = None
    effects: Effects | None = None
    """The call's effects (signals, custom chunks, an abort), applied at the call's turn in the
    step: calls run concurrently, their effects reach the run in the order the model called them."""
    model_output: Any = None
    """What the model sees of `result` (the tool's toModelOutput); None: the result itself."""
    suspended: Suspension | None = None
    """The tool suspended itself (`result` and `error` mean nothing then): the run stops at this
    call until the caller resumes it with data (`run.tool_calls`)."""


class Tool(Protocol):
    """A tool of an agent: a static result, a sidecar's, an MCP server's, or the client's."""

    @property
    def name(self) -> str:
        """The name the model calls it by."""
        ...

    @property
    def description(self) -> str:
        """What it does, for the model."""
        ...

    @property
    def input_schema(self) -> dict[str, Any]:
        """JSON schema of its arguments (checked before it runs)."""
        ...

    @property
    def requires_approval(self) -> bool:
        """Whether each call waits for a decision."""
        ...

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> ToolOutcome | None:
        """Run the call; None when the run does not execute it (a client tool: the caller does)."""
        ...


def spec(tool: Tool) -> dict[str, Any]:
    """What the model sees of a tool."""
    return {"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema}


def invalid_args(tool: Tool, args: Any) -> str | None:
    """Why `args` do not match the tool's schema (the model is told, and may try again), or None."""
    try:
        validator = jsonschema.Draft202012Validator(tool.input_schema or {"type": "object"})
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path))
    except jsonschema.SchemaError as exc:  # checked at start-up; a per-call client tool may slip by
        return f"tool {tool.name!r} has an invalid input schema: {exc.message}"
    if not errors:
        return None
    lines = "\n".join(f"- {'.'.join(map(str, e.absolute_path)) or 'root'}: {e.message}" for e in errors)
    shown = json.dumps(args, ensure_ascii=False, default=str)
    if len(shown) > _MAX_ARGS_IN_ERROR:
        shown = shown[:_MAX_ARGS_IN_ERROR] + "…"
    return (
        f"Tool input validation failed for {tool.name}. Please fix the following errors and try "
        f"again:\n{lines}\n\nProvided arguments: {shown}"
    )


@dataclass(frozen=True)
class StaticTool:
    """A tool that returns a configured result (and may emit one data chunk first)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    result: Any
    custom: dict[str, Any] | None = None
    requires_approval: bool = False

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> ToolOutcome:
        """Emit the data chunk, if any, then return the result."""
        if self.custom is not None:
            await writer({"type": self.custom["type"], "data": self.custom.get("data")})
        return ToolOutcome(self.result)


@dataclass(frozen=True)
class ProcessorTool:
    """A tool run by a sidecar over ExecuteTool: one it hosts, or one a processor added to a step.

    `host` is the lane entry the call goes to (`procmesh_orchestrator.processors` builds it: its
    timeout and failure policy are the tool's). A fail-closed failure ends the run; failed open,
    the model is told the tool is unavailable.
    """

    name: str
    description: str
    input_schema: dict[str, Any]
    host: Processor
    hosted_name: str = ""
    """The sidecar's name for the tool, when the agent's config renamed it."""
    requires_approval: bool = False

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> ToolOutcome:
        """Call the sidecar; its effects (signals, custom chunks, an abort) go back with the outcome."""
        name = self.hosted_name or self.name
        args = ExecuteToolArgs(name, call.call_id, call.args, run.ml.view(), call.resumed)
        answer = await run.call(self.host, args)
        if answer is None:
            return ToolOutcome(error=f"tool {self.name!r} is unavailable: its sidecar failed (fail-open)")
        result, effects = answer
        if result.suspended is not None:
            return ToolOutcome(effects=effects, suspended=result.suspended)
        if result.error is not None:
            return ToolOutcome(error=result.error, effects=effects)
        return ToolOutcome(result.result, effects=effects, model_output=result.model_output)


@dataclass(frozen=True)
class ClientTool:
    """A tool the caller runs (`@mastra/client-js` ``clientTools``): the run stops at its call,
    the client executes it and continues the conversation with the result."""

    name: str
    description: str
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    requires_approval: bool = False

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> None:
        """Nothing here: the client runs it."""
        return None
