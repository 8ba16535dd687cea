"""An agent's working memory in the configuration (``memory.workingMemory``): the reference's
options, a Markdown template or a JSON Schema, and its scope."""

from __future__ import annotations

from typing import Any, Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class WorkingMemoryConfig(_Model):
    """``memory.workingMemory``: a text the model keeps about the user (or the thread) and
    updates with the ``updateWorkingMemory`` tool (docs/configuration.md#working-memory)."""

    enabled: bool = True
    scope: Literal["resource", "thread"] = "resource"
    """``resource``: one working memory shared by every thread of the resource (the reference's
    default); ``thread``: one per thread."""
    template: str | None = None
    """The Markdown the model fills in (default: the reference's "# User Information" list)."""
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    """A JSON Schema of an object instead of a template: the memory is JSON, and each update is
    merged into it (``null`` deletes a field, arrays are replaced)."""
    agent_managed: bool = True
    """False: the model reads it but gets no tool to change it (only the APIs do)."""

    @field_validator("json_schema")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is None:
            return None
        try:
            jsonschema.Draft7Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"not a valid JSON Schema: {exc.message}") from None
        if schema.get("type") != "object":
            raise ValueError('the working memory schema must describe an object ("type": "object")')
        return schema

    @model_validator(mode="after")
    def _one_shape(self) -> WorkingMemoryConfig:
        if self.template is not None and self.json_schema is not None:
            raise ValueError("give a template or a schema, not both")
        return self
