"""The options of `tool-search`, validated by the SDK before a hook runs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class ToolSpecModel(BaseModel):
    """A tool as the model sees it."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")  # a misspelt key is an error

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=dict, alias="inputSchema")


class SearchOptions(BaseModel):
    """`search` options (the reference's ``topK``/``minScore`` are refused by name, not ignored)."""

    model_config = ConfigDict(extra="forbid")

    top_k: int = Field(default=5, ge=1)
    min_score: float = 0.0
    auto_load: bool = False
    """`search_tools` loads what it finds (no `load_tool` meta-tool)."""


class ToolSearchOptions(BaseModel):
    """Options of `tool-search`."""

    tools: list[ToolSpecModel] = []
    """The searchable catalog (specs; to run, a tool must also be one of the agent's tools)."""
    include_resolved_tools: bool = False
    """Also make the agent's own tools for this request searchable, and withhold them until loaded."""
    inject_catalog: bool = False
    """List the catalog (name and short description) in a system message, so the model can load directly."""
    search: SearchOptions = SearchOptions()
    storage: Literal["in-memory", "context"] = "in-memory"
    """``in-memory``: the run's state, plus this sidecar's memory per thread id (with `ttl`);
    ``context``: derived from the completed meta-tool results in the conversation."""
    ttl: float = Field(default=3_600_000, ge=0)
    """In-memory thread entries expire after this many ms without use (0: never)."""
