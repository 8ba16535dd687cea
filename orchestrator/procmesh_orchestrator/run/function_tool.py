"""`FunctionTool`: a tool that runs in the orchestrator's process, an async Python callable, for
embedders building `AgentSpec.tools` (a sidecar's tool is the other way: `procmesh.Tool`).

It has what the seeds give a tool in the form Python callables take: ``suspend(payload)`` and
the caller's ``resume_data`` (SEED-GAPS P6) on its context, and the lifecycle hooks
``on_input_start``, ``on_input_available``, ``on_output`` (P7) as callables. The model's arguments
arrive whole (no provider streams them), so ``on_input_start`` comes right before
``on_input_available`` (the AI SDK's rule without input streaming) and ``onInputDelta`` has no
place. A hook that raises is logged, never the call's failure; the callable's own exception is
the tool's error, as any tool's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.run.hooks import Suspension
from procmesh_orchestrator.run.tools import ToolCall, ToolOutcome, Writer

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

log = logging.getLogger(__name__)


@dataclass
class FunctionToolContext:
    """What a `FunctionTool`'s callable and hooks get besides the arguments."""

    run_id: str
    agent_id: str
    tool_call_id: str
    request_context: dict[str, Any]
    """The caller's request context, a copy."""
    messages: list[dict[str, Any]]
    """The conversation so far."""
    writer: Writer
    """Emits ``data-*`` chunks (``await context.writer({"type": "data-...", "data": ...})``)."""
    resumed: bool = False
    """True when the call suspended before and the caller resumed it with data."""
    resume_data: Any = None
    """What the caller resumed the call with (the seeds' ``resumeData``); set only when resumed."""
    suspend_payload: Any = None
    """What the call suspended with last time (the seeds' ``suspendPayload``); set only when resumed."""
    suspended: Suspension | None = field(default=None, repr=False)

    async def suspend(self, payload: Any, *, resume_schema: dict[str, Any] | None = None) -> None:
        """Suspend the call (the seeds' ``suspend(payload)``): what the callable then returns is
        dropped, the run stops at this call (kept in the store) and streams
        ``tool-call-suspended``; resumed with data, the callable runs again with `resumed`,
        `resume_data` and `suspend_payload` set."""
        schema = None if resume_schema is None else json.dumps(resume_schema)
        self.suspended = Suspension(payload, schema)


Hook = Callable[..., Awaitable[None]]


@dataclass(frozen=True)
class FunctionTool:
    """A tool of the agent that runs `function(args, context)` in this process."""

    name: str
    description: str
    function: Callable[[Any, FunctionToolContext], Awaitable[Any]]
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    requires_approval: bool = False
    on_input_start: Hook | None = None
    """``await on_input_start(context)``: a call begins."""
    on_input_available: Hook | None = None
    """``await on_input_available(args, context)``: the arguments are whole, before `function`."""
    on_output: Hook | None = None
    """``await on_output(output, context)``: `function` returned (not after a raise or a suspension)."""

    async def execute(self, run: RunCore, call: ToolCall, writer: Writer) -> ToolOutcome:
        """Run the callable with its hooks around it; a suspension or its error as the outcome."""
        context = FunctionToolContext(
            run.run_id,
            run.agent.id,
            call.call_id,
            dict(run.options.request_context),
            run.ml.view(),
            writer,
            resumed=call.resumed is not None,
            resume_data=None if call.resumed is None else call.resumed.data,
            suspend_payload=None if call.resumed is None else call.resumed.suspend_payload,
        )
        await self._hook("on_input_start", context)
        await self._hook("on_input_available", call.args, context)
        try:
            result = await self.function(call.args, context)
        except Exception as exc:  # the tool's error: the model reads it
            log.warning("tool %s raised %s", self.name, type(exc).__name__, exc_info=True)
            return ToolOutcome(error=str(exc) or type(exc).__name__)
        if context.suspended is not None:
            return ToolOutcome(suspended=context.suspended)
        await self._hook("on_output", result, context)
        return ToolOutcome(result)

    async def _hook(self, name: str, *args: Any) -> None:
        hook = getattr(self, name)
        if hook is None:
            return
        try:
            await hook(*args)
        except Exception:
            log.exception("tool %s: %s raised", self.name, name)
