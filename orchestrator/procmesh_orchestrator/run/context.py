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

The agent's ``requestContextSchema`` (`ContextSchema`) is also checked on the caller's context
before any processor is called: a missing required key, a value of the wrong type or shape, and a
key the agent does not declare each fail the call with `RequestContextError` naming the keys (over
HTTP a 400, over gRPC INVALID_ARGUMENT). A key is declared when the schema's ``properties`` names
it or one of its ``patternProperties`` matches it; unlike plain JSON Schema, an absent
``additionalProperties`` counts as ``false`` (a key no processor was written for is a mistake or a
probe, never passed on silently); ``additionalProperties: true`` (or a schema) accepts other keys.
Over the APIs the per-key trust comes first (``PROCMESH_TRUSTED_CONTEXT``: may this caller send
this key?), then the agent's schema (does the agent take it, in this shape?).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import jsonschema

from procmesh_orchestrator.errors import ConfigError, OrchestratorError, RequestContextError
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


def _at(where: str, message: str) -> str:
    return f"{where}: {message}" if where else message


@dataclass(frozen=True)
class ContextSchema:
    """An agent's compiled ``requestContextSchema``."""

    agent_id: str
    schema: Mapping[str, Any]
    _validator: Any = field(repr=False, compare=False)
    _patterns: tuple[re.Pattern[str], ...] = field(repr=False, compare=False, default=())

    @classmethod
    def of(
        cls, agent_id: str, schema: Mapping[str, Any], where: str = "requestContextSchema"
    ) -> ContextSchema:
        """Compile `schema`; ConfigError naming `where` when it is no JSON Schema of an object."""
        if not isinstance(schema, Mapping):
            raise ConfigError(_at(where, f"must be a JSON Schema object, got {type(schema).__name__}"))
        kind = schema.get("type", "object")
        if kind != "object":
            raise ConfigError(
                _at(where, f"the request context is an object: type must be 'object', got {kind!r}")
            )
        full = {"type": "object", **schema}
        full.setdefault("additionalProperties", False)
        try:
            jsonschema.Draft202012Validator.check_schema(full)
            patterns = tuple(re.compile(p) for p in full.get("patternProperties", {}))
        except jsonschema.SchemaError as exc:
            path = ".".join(str(p) for p in exc.absolute_path)
            raise ConfigError(
                _at(where, f"not a valid JSON Schema at {path or '(top)'}: {exc.message}")
            ) from None
        except re.error as exc:
            raise ConfigError(_at(where, f"patternProperties: {exc}")) from None
        return cls(agent_id, full, jsonschema.Draft202012Validator(full), patterns)

    @property
    def declared(self) -> frozenset[str]:
        """The keys ``properties`` names."""
        return frozenset(self.schema.get("properties", {}))

    @property
    def open(self) -> bool:
        """Whether keys it does not declare are accepted (``additionalProperties`` is not false)."""
        return self.schema.get("additionalProperties") is not False

    def undeclared(self, context: Mapping[str, Any]) -> list[str]:
        """The keys of `context` the agent does not declare (none when the schema is open)."""
        if self.open:
            return []
        declared = self.declared
        return sorted(
            k for k in context if k not in declared and not any(p.search(k) for p in self._patterns)
        )

    def check(self, context: Mapping[str, Any], where: str = "requestContext") -> None:
        """RequestContextError naming the keys when `context` is not one the agent accepts."""
        undeclared = self.undeclared(context)
        if undeclared:
            raise RequestContextError(
                f"{where}: agent {self.agent_id!r} does not declare {names(undeclared)} in its "
                f"requestContextSchema (declared: {names(self.declared) or 'none'})",
                keys=undeclared,
            )
        errors = list(self._validator.iter_errors(dict(context)))
        if not errors:
            return
        missing = sorted(
            name
            for e in errors
            if e.validator == "required" and not e.absolute_path
            for name in e.validator_value
            if name not in context
        )
        if missing:
            raise RequestContextError(
                f"{where}: agent {self.agent_id!r} requires {names(missing)} (requestContextSchema), "
                "missing from the request context",
                keys=missing,
            )
        first = min(errors, key=lambda e: (list(map(str, e.absolute_path)), e.message))
        path = [str(p) for p in first.absolute_path]
        raise RequestContextError(
            f"{where}{''.join('.' + p for p in path)}: {first.message} "
            f"(agent {self.agent_id!r} requestContextSchema)",
            keys=path[:1],
        )


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
