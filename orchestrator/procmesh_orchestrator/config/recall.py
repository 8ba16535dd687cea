"""``memory.semanticRecall``: the reference's semantic recall options, with the embedder named.

``{embedder: provider/model-id, topK: 4, messageRange: 1 | {before, after}, scope: resource |
thread, threshold}``, defaults as the reference's (`@mastra/memory`: topK 4, messageRange 1, scope
resource). docs/configuration.md#semantic-recall.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.store.recall import Range


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)


class MessageRangeConfig(_Model):
    """How many messages of a hit's thread come with it."""

    before: int = Field(default=1, ge=0, le=50)
    after: int = Field(default=1, ge=0, le=50)


class SemanticRecallConfig(_Model):
    """Messages like the caller's last user message, recalled from the resource's (or the
    thread's) stored history by their embeddings."""

    embedder: str
    """The embedding model, ``provider/model-id`` of an ``openai``-kind provider (its
    ``/embeddings`` endpoint)."""
    top_k: int = Field(default=4, ge=1, le=100)
    """How many of the most similar stored messages are recalled."""
    message_range: Annotated[int, Field(ge=0, le=50)] | MessageRangeConfig = 1
    """Messages of each hit's thread recalled with it: before and after (a number: both)."""
    scope: Literal["thread", "resource"] = "resource"
    """``resource``: every thread of the caller's resource (other threads' messages are shown as
    the reference shows them, in a system message); ``thread``: this thread only."""
    threshold: float | None = Field(default=None, ge=-1, le=1)
    """The lowest cosine similarity recalled (none: the `top_k` best, however far)."""

    @field_validator("embedder")
    @classmethod
    def _embedder(cls, value: str) -> str:
        provider, sep, model = value.partition("/")
        if not sep or not provider or not model:
            raise ValueError(f"embedder must be 'provider/model-id', got {value!r}")
        return value

    @property
    def span(self) -> Range:
        """`message_range` as a `Range`."""
        r = self.message_range
        return Range(r, r) if isinstance(r, int) else Range(r.before, r.after)
