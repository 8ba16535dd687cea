"""The model interface the loop calls: `ModelProvider` and its `ModelRequest`.

The models themselves live with the providers (`procmesh_orchestrator.providers`: the HTTP
providers, and the built-in `scripted` and `demo` models in `providers.builtin`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

Chunk = dict[str, Any]


@dataclass
class ModelRequest:
    """One provider call: the prompt and the step's settings."""

    prompt: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = None
    streaming: bool = True
    provider_options: dict[str, Any] = field(default_factory=dict)
    model_settings: dict[str, Any] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None
    """``{"type": "json", "schema", "name"}``: answer with JSON matching the schema (structured output)."""

    def digest(self) -> str:
        """SHA-256 of what the model is shown (prompt, tools, tool choice, response format; not
        how it streams): a recorded run keeps it per model call, and a replay whose candidate
        shows the model something else knows the recorded answer no longer applies."""
        shown = [self.prompt, self.tools, self.tool_choice, self.response_format]
        text = json.dumps(shown, sort_keys=True, ensure_ascii=False, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def specification_version(model: ModelProvider) -> str:
    """The model specification version a model reports (``specification_version``: ``v2``...);
    empty for a model that does not say (the response cache's key then reads ``unknown``)."""
    return str(getattr(model, "specification_version", "") or "")


def setting_warnings(model: ModelProvider, model_settings: dict[str, Any]) -> list[dict[str, Any]]:
    """The call settings `model`'s API has no field for, as the reference's call warnings
    (``{type: "unsupported-setting", setting, details}``): a model that can say lists them in an
    ``unsupported_settings(settings)`` method (the HTTP providers); others send none."""
    unsupported = getattr(model, "unsupported_settings", None)
    names: list[str] = unsupported(model_settings) if unsupported is not None else []
    why = f"{model.model_id}'s API has no such setting: it was not sent"
    return [{"type": "unsupported-setting", "setting": name, "details": why} for name in names]


class ModelProvider(Protocol):
    """A model: streams ``text-delta`` and ``tool-call`` chunks, then one ``finish`` chunk.

    A rejection raises `APICallError` (before or during the stream).
    """

    model_id: str

    def stream(self, request: ModelRequest) -> AsyncIterator[Chunk]:
        """Stream the response to `request`."""
        ...
