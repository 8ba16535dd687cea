"""The config's ``requestContextSchema`` (an agent's JSON Schema of the request context it
accepts), checked as a schema when the config loads; the run compiles and applies it
(`run.context.ContextSchema`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator

from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.run.context import ContextSchema


def _checked(value: dict[str, Any]) -> dict[str, Any]:
    try:
        ContextSchema.of("", value, "")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return value


SchemaOfContext = Annotated[dict[str, Any], AfterValidator(_checked)]
"""The config's ``requestContextSchema``: a JSON Schema of an object, checked when loaded."""
