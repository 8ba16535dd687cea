"""A run's request context, shared by its hooks and tools: the values hooks set, and which they may.

A hook sets values as data (``HookEffects.request_context_updates``, the seeds'
``requestContext.set(key, value)`` in ``processInput``): each key replaces the run's value of that
key when the call's answer is applied, with its state, so later hooks of the run see it in their
``RunContext.request_context``, the run's tools get it (a sidecar tool in its request, an MCP tool
in the call's ``_meta``, a client tool in its ``tool-call`` chunk) and a suspended or durable run
keeps it in its snapshot (`hook_values`). The caller's own context stays what lanes and options
were chosen from: a hook's value reaches hooks and tools, never the choice of the run's lanes.

A value is refused, and the call counts as failed under its processor's failure policy
(fail-closed: the run fails naming the processor, the hook and the key; fail-open: the answer is
dropped whole, logged and counted as ``failed_open``), when its key is reserved (`RESERVED_KEYS`:
the server sets the thread, the resource and the cache scope) or when the agent declares a
``requestContextSchema`` that does not accept the context with it (an undeclared key, a value of
the wrong shape).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from procmesh_orchestrator.errors import OrchestratorError
from procmesh_orchestrator.run.tools import ClientTool

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore
    from procmesh_orchestrator.run.hooks import Chunk, RunInfo

RESERVED_KEYS = frozenset(
    {
        "threadId",
        "resourceId",
        "mastra__threadId",
        "mastra__resourceId",
        "responseCache",
        "mastra__response_cache_context",
    }
)
"""Context keys that select a thread, a resource or a cache scope: the server sets them, never a
caller (`service._trust`) nor a hook."""

MCP_META_KEY = "procmesh/requestContext"
"""The key of an MCP ``tools/call``'s ``params._meta`` that holds the run's request context (a
prefixed name, as the MCP spec asks of keys it does not define)."""

_SHOWN = 8


class ContextCheck(Protocol):
    """An agent's compiled ``requestContextSchema``, as the run needs it."""

    def check(self, context: Mapping[str, Any], where: str = ...) -> None:
        """Raise an `OrchestratorError` naming the keys when `context` is not one it accepts."""
        ...


def names(keys: Iterable[str]) -> str:
    """Keys for a message: sorted, quoted, the first few."""
    ordered = sorted(keys)
    shown = ", ".join(repr(k[:64]) for k in ordered[:_SHOWN])
    return shown + (f" and {len(ordered) - _SHOWN} more" if len(ordered) > _SHOWN else "")


def refusal(info: RunInfo, values: Mapping[str, Any]) -> str | None:
    """Why a hook may not set `values` in the run `info` describes (None: it may).

    Reserved keys first; then the agent's schema, on the run's context with the values set.
    """
    reserved = RESERVED_KEYS.intersection(values)
    if reserved:
        return (
            f"it set request-context key {names(reserved)}, which is reserved: the server sets the "
            "thread, the resource and the cache scope, never a processor"
        )
    if info.context_check is not None:
        try:
            info.context_check.check({**info.request_context, **values}, "request context set by a hook")
        except OrchestratorError as exc:
            return f"it set request-context key {names(values)}, which the agent refuses: {exc}"
    return None


def set_values(info: RunInfo, values: Mapping[str, Any]) -> None:
    """Apply a hook's values (checked by `refusal`): the run's context and `RunInfo.hook_values`
    are replaced, never changed in place (the caller's dict and requests already built keep
    theirs; a caller that caches a converted context sees a new object)."""
    if not values:
        return
    info.request_context = {**info.request_context, **values}
    info.hook_values = {**info.hook_values, **values}


def accept(info: RunInfo, values: Mapping[str, Any]) -> str | None:
    """Apply a hook's values to the run, as its caller does when it applies the hook's answer (with
    its state); why they are refused instead (`refusal`: the call then fails under its policy)."""
    refused = refusal(info, values)
    if refused is None:
        set_values(info, values)
    return refused


def serializable(context: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `context` that are JSON (a Python caller may put functions, connections and
    the like in it; those stay in the process)."""
    kept: dict[str, Any] = {}
    for key, value in context.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        kept[key] = value
    return kept


def for_client(run: RunCore, chunk: Chunk) -> Chunk:
    """A ``tool-call`` chunk as the caller gets it: a call of one of its client tools carries the
    run's request context (``payload.requestContext``, its JSON entries), as the client's tool is
    run with it; other chunks as they are."""
    payload = chunk.get("payload") or {}
    if not isinstance(run.tools.get(payload.get("toolName", "")), ClientTool):
        return chunk
    return {**chunk, "payload": {**payload, "requestContext": serializable(run.info.request_context)}}
