"""An agent's token budget on memory's history (``memory.messageHistory``): the reference's
``{maxTokens, atMaxRemoveTokens}`` (`run.framework.history_budget` says what it does)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from procmesh_orchestrator.run.framework.history_budget import HistoryBudget


class MessageHistoryConfig(BaseModel):
    """``memory.messageHistory``: the call's context (system, history, the call) in
    ``maxTokens``; only history is trimmed, oldest first, to ``atMaxRemoveTokens`` under it."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, alias_generator=to_camel, frozen=True)

    max_tokens: float = Field(ge=0, allow_inf_nan=False)
    """The budget (0: no history, as the reference)."""
    at_max_remove_tokens: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    """How far under `max_tokens` a trim goes (default: a quarter of it); at most `max_tokens`."""

    @model_validator(mode="after")
    def _fits(self) -> MessageHistoryConfig:
        self.budget()  # the reference's checks, its words
        return self

    def budget(self) -> HistoryBudget:
        """The run's budget."""
        return HistoryBudget.of(self.max_tokens, self.at_max_remove_tokens)
