"""The one hook table: every hook's name, RPC, enum value, arguments and wire messages.

Everything that needs to know the hooks derives it from :data:`HOOKS`: the `Processor` base class
(which methods are hooks and what they may declare), the SDK server (one RPC handler per entry,
built from the entry's ``decode`` and ``encode``),
the orchestrator's client side (request and response types per hook), ``procmesh-check-sidecar``
and the scripted conformance sidecar. The Node SDK keeps a twin table (``sdk/node/lib/hooks.js``);
a test checks both against the proto's ``Hook`` enum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from procmesh import _decode, _encode
from procmesh.v1 import processor_pb2 as ppb

Decode = Callable[[Any], dict[str, Any]]
"""A request message -> the hook's own keyword arguments (those every hook gets come from its context)."""
Encode = Callable[[Any, dict[str, Any]], Any]
"""(The hook's return value, the arguments it was handed) -> the response message, effects unset."""

_BASE = (
    "abort",
    "state",
    "options",
    "retry_count",
    "step_number",
    "run_id",
    "agent_id",
    "thread_id",
    "resource_id",
    "on_failure",
    "request_context",
    "send_signal",
    "writer",
    "report_violation",
    "model",
)
_MESSAGES = ("messages", "message_list", "system_messages")
BASE_ARGUMENTS: frozenset[str] = frozenset(_BASE)
"""The arguments every hook may declare (from the request's ``RunContext`` and the call's effects)."""


@dataclass(frozen=True)
class Hook:
    """One processor hook as the contract defines it."""

    name: str
    """The Python method name (the seeds' hook in snake_case), e.g. ``process_input``."""
    rpc: str
    """The ``ProcessorService`` method, e.g. ``ProcessInput``."""
    enum: int
    """The ``procmesh.v1.Hook`` value that ``Describe`` lists."""
    arguments: frozenset[str]
    """The arguments a hook implementation may declare by name."""
    own: frozenset[str]
    """Those its request carries (`decode`'s): a hook declaring one is given its request decoded.
    ``model`` is one in the step hooks (the step's model id, in place of the gateway)."""
    request: Any
    """The request message class (for the stream: one ``ProcessOutputStreamRequest`` message)."""
    response: Any
    """The response message class."""
    decode: Decode
    """The request -> the hook's own arguments (for the stream: one ``StreamPart`` -> ``part``)."""
    encode: Encode
    """The return value -> the response (for the stream: one ``StreamPartResult``); only when not aborted."""
    streaming: bool = False
    """True for the bidirectional output stream."""


def _hook(name: str, rpc: str, enum: int, extra: tuple[str, ...], *, streaming: bool = False) -> Hook:
    return Hook(
        name=name,
        rpc=rpc,
        enum=enum,
        arguments=frozenset(_BASE + extra),
        own=frozenset(extra),
        request=getattr(ppb, f"{rpc}Request"),
        response=getattr(ppb, f"{rpc}Response"),
        decode=getattr(_decode, name),
        encode=getattr(_encode, name),
        streaming=streaming,
    )


HOOKS: tuple[Hook, ...] = (
    _hook("process_input", "ProcessInput", ppb.HOOK_PROCESS_INPUT, _MESSAGES),
    _hook(
        "process_input_step",
        "ProcessInputStep",
        ppb.HOOK_PROCESS_INPUT_STEP,
        (
            *_MESSAGES,
            "model",
            "tools",
            "tool_choice",
            "active_tools",
            "provider_options",
            "model_settings",
            "steps",
        ),
    ),
    _hook(
        "process_llm_request",
        "ProcessLLMRequest",
        ppb.HOOK_PROCESS_LLM_REQUEST,
        ("prompt", "model", "model_spec_version", "steps"),
    ),
    _hook(
        "process_llm_response",
        "ProcessLLMResponse",
        ppb.HOOK_PROCESS_LLM_RESPONSE,
        ("chunks", "model", "steps", "from_cache"),
    ),
    _hook(
        "process_output_stream",
        "ProcessOutputStream",
        ppb.HOOK_PROCESS_OUTPUT_STREAM,
        ("part", "stream_parts", "release"),
        streaming=True,
    ),
    _hook(
        "process_output_step",
        "ProcessOutputStep",
        ppb.HOOK_PROCESS_OUTPUT_STEP,
        (*_MESSAGES, "text", "tool_calls", "finish_reason", "usage", "steps"),
    ),
    _hook(
        "process_tool_result",
        "ProcessToolResult",
        ppb.HOOK_PROCESS_TOOL_RESULT,
        ("messages", "tool_name", "tool_call_id", "args", "result", "provider_executed", "steps"),
    ),
    _hook(
        "process_output_result",
        "ProcessOutputResult",
        ppb.HOOK_PROCESS_OUTPUT_RESULT,
        ("messages", "message_list", "result"),
    ),
    _hook(
        "process_api_error",
        "ProcessAPIError",
        ppb.HOOK_PROCESS_API_ERROR,
        ("error", "messages", "message_list", "steps"),
    ),
    _hook(
        "execute_tool",
        "ExecuteTool",
        ppb.HOOK_EXECUTE_TOOL,
        ("tool_name", "tool_call_id", "args", "messages"),
    ),
)
"""Every hook, in the proto enum's order."""

BY_NAME: dict[str, Hook] = {hook.name: hook for hook in HOOKS}
"""Hooks by Python method name."""
BY_ENUM: dict[int, Hook] = {hook.enum: hook for hook in HOOKS}
"""Hooks by ``procmesh.v1.Hook`` value."""
BY_RPC: dict[str, Hook] = {hook.rpc: hook for hook in HOOKS}
"""Hooks by ``ProcessorService`` method name."""

quiet_effects = _encode.quiet_effects
"""The effects of an answer in which none of a call's processors did anything (one empty outcome
per further processor of a fused call): what a sidecar sends for a fused pass-through part and
the orchestrator commits at once."""
