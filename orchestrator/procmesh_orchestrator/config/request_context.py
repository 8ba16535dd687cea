"""An agent's ``requestContextSchema``: the request context it accepts, as JSON Schema (the
seeds' validation of required values before ``processInput``).

A run's request context is checked against it before any processor is called: a missing
required key, a value of the wrong type or shape, and a key the agent does not declare each fail
the call with `RequestContextError` naming the keys (over HTTP a 400, over gRPC
INVALID_ARGUMENT). A key is declared when the schema's ``properties`` names it or one of its
``patternProperties`` matches it; unlike plain JSON Schema, an absent ``additionalProperties``
counts as ``false`` (a key no processor was written for is a mistake or a probe, never passed on
silently); ``additionalProperties: true`` (or a schema) accepts other keys.

Over the APIs the per-key trust comes first (``PROCMESH_TRUSTED_CONTEXT``: may this caller send
this key?), then the agent's schema (does the agent take it, in this shape?).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import jsonschema
from pydantic import AfterValidator

from procmesh_orchestrator.errors import ConfigError, RequestContextError

_SHOWN = 8


def _at(where: str, message: str) -> str:
    return f"{where}: {message}" if where else message


def key_names(keys: Iterable[str]) -> str:
    ordered = sorted(keys)
    shown = ", ".join(repr(k[:64]) for k in ordered[:_SHOWN])
    return shown + (f" and {len(ordered) - _SHOWN} more" if len(ordered) > _SHOWN else "")


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
                f"{where}: agent {self.agent_id!r} does not declare {key_names(undeclared)} in its "
                f"requestContextSchema (declared: {key_names(self.declared) or 'none'})",
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
                f"{where}: agent {self.agent_id!r} requires {key_names(missing)} (requestContextSchema), "
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


def _checked(value: dict[str, Any]) -> dict[str, Any]:
    try:
        ContextSchema.of("", value, "")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return value


SchemaOfContext = Annotated[dict[str, Any], AfterValidator(_checked)]
"""The config's ``requestContextSchema``: a JSON Schema of an object, checked when loaded."""
