"""Tool: a standalone tool a sidecar hosts, which agent configs name; and what serving one takes.

A processor's ``execute_tool`` runs tools that processor added to a step; a `Tool` is the other
kind: listed by ``Describe`` (``DescribeResponse.tools``) and called with ``ExecuteTool`` and an
empty ``context.processor_id``. Each hosted tool runs on its own `HookLoop`, as each processor
does, so a tool that computes cannot stall health checks or the other tools and processors.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from procmesh import convert
from procmesh._hookloop import HookLoop
from procmesh.v1 import processor_pb2 as ppb

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What every model provider accepts as a tool name (OpenAI's and Anthropic's rule)."""
ERROR_CHARS = 2048
"""A tool error longer than this is clipped: the model reads it, and it costs context."""


class ToolWriter:
    """A hosted tool's ``writer``: `custom()` emits a ``data-*`` chunk (the seeds' ``writer.custom()``).

    The chunks go back with the call's answer (``ExecuteToolResponse.effects.custom_chunks``), in
    the order written; the orchestrator emits them at the call's turn in the step, before its
    ``tool-result``, through the output processors that take data parts. A chunk of another type
    is the tool's error (a ``ValueError``), as a bug in the tool is.
    """

    def __init__(self) -> None:
        self.chunks: list[dict[str, Any]] = []

    async def custom(self, chunk: dict[str, Any]) -> None:
        """Emit ``{"type": "data-...", "data": ..., "transient"?: bool}``."""
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        if not isinstance(kind, str) or not kind.startswith("data-"):
            raise ValueError(f"writer.custom: chunk type must start with 'data-', got {kind!r}")
        self.chunks.append(dict(chunk))


@dataclass(frozen=True)
class ToolContext:
    """What a tool call is handed besides its arguments: the run it serves and the conversation.

    Cancellation is asyncio's: when the orchestrator cancels the call (or its deadline passes),
    the task running `Tool.execute` is cancelled, so the tool stops at its next ``await``.
    """

    run_id: str
    """The run (one ``generate()``/``stream()`` call) that called the tool."""
    agent_id: str
    """The agent whose model called the tool."""
    tool_call_id: str
    """The model's id for this call."""
    thread_id: str | None
    """The run's memory thread (None without memory)."""
    resource_id: str | None
    """Who the thread belongs to (None without memory)."""
    request_context: dict[str, Any]
    """The caller's serializable request context."""
    messages: list[dict[str, Any]]
    """The conversation so far, as hooks see messages."""
    writer: ToolWriter = field(default_factory=ToolWriter)
    """Emits ``data-*`` chunks to the caller's stream (``await context.writer.custom({...})``)."""
    resumed: bool = False
    """True when the call suspended before (`suspend`) and the caller resumed it with data."""
    resume_data: Any = None
    """What the caller resumed the call with (the seeds' ``resumeData``; any JSON): set only when
    `resumed`."""
    suspend_payload: Any = None
    """What the call suspended with last time (the seeds' ``suspendPayload``): set only when
    `resumed`."""
    _suspension: list[tuple[Any, str]] = field(default_factory=list, repr=False, compare=False)

    async def suspend(self, payload: Any, *, resume_schema: dict[str, Any] | None = None) -> None:
        """Suspend the call (the seeds' ``suspend(payload)``): once `Tool.execute` returns, what it
        returned is dropped, the run stops at this call (kept in the store, on any replica) and
        streams a ``tool-call-suspended`` chunk with `payload` (any JSON) and `resume_schema` (the
        data it expects). The caller resumes it with data (resume-stream); the tool then runs
        again with `resumed`, `resume_data` and `suspend_payload` set. ``return await
        context.suspend(...)`` reads as the reference's tools do."""
        self._suspension[:] = [(payload, "" if resume_schema is None else json.dumps(resume_schema))]

    @property
    def suspension(self) -> tuple[Any, str] | None:
        """(payload, resume schema as JSON text) once `suspend` was called, else None."""
        return self._suspension[0] if self._suspension else None


class Tool:
    """Base class for a tool a sidecar hosts: set `name` (and a `description`), implement `execute`.

    Serve it beside processors, ``run([...], tools=[Weather()])`` or
    ``ProcessorServer([...], tools=[...])``; an agent config names it, and the orchestrator offers
    it to the model and routes its calls here. The orchestrator validates the model's arguments
    against `input_schema`; the SDK does not.

    What `execute` returns (any JSON value) is the tool's result. What it raises is the tool's
    error, shown to the model (``ExecuteToolResponse.error``, the message clipped), not a failed
    call; a `procmesh.errors.ProcmeshError` instead fails the call with its status code.

    Class attributes:
        name: The tool's name, unique in the sidecar (letters, digits, ``_`` and ``-``; at most 64).
        description: What the tool does, for the model.
        input_schema: JSON schema of the arguments, an object schema (``{"type": "object", ...}``).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    input_schema: ClassVar[dict[str, Any]] = {"type": "object"}

    async def setup(self) -> None:
        """Prepare resources (on the tool's own loop); the server reports SERVING only after it."""

    async def teardown(self) -> None:
        """Release resources when the server stops."""

    async def execute(self, args: dict[str, Any], context: ToolContext) -> Any:
        """Run one call: `args` as the model sent them; return the result (any JSON value)."""
        raise NotImplementedError

    def to_model_output(self, result: Any) -> Any:
        """What the model sees of `result` (the seeds' ``toModelOutput``); override to differ.

        The caller's ``tool-result`` chunk and the stored message keep `result`; the prompt shows
        this (any JSON value, e.g. a short text for a large result). Not overridden: the model
        sees `result`. What it raises is the tool's error.
        """
        return result

    # The seeds' lifecycle hooks (onInputStart, onInputAvailable, onOutput), as the sidecar sees a
    # call: its arguments arrive whole with the call, so on_input_start runs right before
    # on_input_available (the AI SDK's rule without input streaming) and no on_input_delta comes.
    # What one raises is logged, never the call's failure (the reference's rule).

    async def on_input_start(self, context: ToolContext) -> None:
        """A call of this tool begins (before `on_input_available`)."""

    async def on_input_available(self, args: dict[str, Any], context: ToolContext) -> None:
        """The call's arguments are complete, before `execute` (also when a resumed call runs again)."""

    async def on_output(self, output: Any, context: ToolContext) -> None:
        """`execute` returned `output` (not after a raise or a `ToolContext.suspend`)."""


async def lifecycle(tool: Tool, hook: str, *args: Any) -> None:
    """Call one of `tool`'s lifecycle hooks; what it raises is logged, not the call's failure."""
    try:
        await getattr(tool, hook)(*args)
    except Exception:
        logging.getLogger("procmesh.tool").exception("tool %s: %s raised", tool.name, hook)


class HostedTool:
    """One hosted tool, checked when the server is built, with its `HookLoop` and Describe entry."""

    def __init__(self, tool: Tool, *, threaded: bool = True) -> None:
        if not isinstance(tool, Tool):
            raise TypeError(f"a tool must be a procmesh.Tool instance, got {type(tool).__name__}")
        cls = type(tool).__name__
        name = tool.name
        if not isinstance(name, str) or not name:
            raise ValueError(f"tool {cls} has no name")
        if not _NAME.match(name):
            raise ValueError(f"tool {cls}: name {name!r} must be 1-64 letters, digits, '_' or '-'")
        if type(tool).execute is Tool.execute:
            raise ValueError(f"tool {name!r} does not implement execute()")
        schema = tool.input_schema
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise ValueError(
                f"tool {name!r}: input_schema must be a JSON schema object ({{'type': 'object', ...}})"
            )
        try:
            self.schema = convert.to_struct(schema)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tool {name!r}: input_schema is not JSON: {exc}") from exc
        self.tool = tool
        self.name = name
        self.maps_output = type(tool).to_model_output is not Tool.to_model_output
        """The tool defines `to_model_output` (the answer then carries ``model_output``)."""
        self.loop = HookLoop(f"procmesh-tool:{name[:32]}", threaded=threaded)
        """Where this tool's setup, calls and teardown run (started by the server)."""

    def info(self) -> ppb.HostedTool:
        """This tool as ``Describe`` lists it."""
        return ppb.HostedTool(name=self.name, description=self.tool.description, input_schema=self.schema)


def error_text(exc: BaseException) -> str:
    """What the model sees of a tool's exception: its message (else its type), clipped."""
    text = str(exc) or type(exc).__name__
    if len(text) <= ERROR_CHARS:
        return text
    return text[: ERROR_CHARS - 30] + f"... ({len(text)} characters)"
