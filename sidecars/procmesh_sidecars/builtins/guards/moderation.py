"""`moderation`: a judge model scores content against moderation categories (the reference's
ModerationProcessor).

Input lane: every input message (or the last, `last_message_only`) is judged, one call each.
Output lane: the streamed answer is judged per window (which covers ``generate()`` too: its answer
goes through the stream hook as well), so the final result is not judged a second time.
Flagged when a category's score reaches `threshold`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from procmesh_sidecars.builtins.guards._judge import (
    GuardOptions,
    InputHook,
    Phase,
    Question,
    StreamHook,
    ask,
    flag_message,
    nullable,
    quoted,
    scored,
    verdict_object,
)
from procmesh_sidecars.builtins.guards._verdicts import PASS, Action, Verdict

DEFAULT_CATEGORIES = [
    "hate",
    "hate/threatening",
    "harassment",
    "harassment/threatening",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
]
"""OpenAI's moderation categories, the reference's default."""


class ModerationOptions(GuardOptions):
    """Options of `moderation`."""

    categories: list[str] = Field(default_factory=lambda: list(DEFAULT_CATEGORIES), min_length=1)
    threshold: float = Field(default=0.5, ge=0, le=1)
    """A category scoring at least this flags the content."""
    strategy: Literal["block", "warn", "filter"] = "block"
    include_scores: bool = False
    """Put every category's score in the violation message (the detail always has them)."""


def _instructions(categories: list[str]) -> str:
    listed = "\n".join(f"- {c}" for c in categories)
    return (
        "You moderate content. Score the content for each of these categories that it actually "
        f"matches, from 0 (not at all) to 1 (certainly):\n{listed}\n\n"
        "List only categories that apply; when nothing applies, give an empty category_scores list. "
        "Weigh context and intent: educational, historical or creative treatment of a sensitive "
        "topic is usually fine; flag content that could cause real harm, and say why in one sentence."
    )


def _schema(categories: list[str]) -> dict[str, Any]:
    score = verdict_object(
        {"category": {"enum": categories}, "score": {"type": "number", "minimum": 0, "maximum": 1}}
    )
    return verdict_object(
        {
            "category_scores": nullable({"type": "array", "items": score}),
            "reason": nullable({"type": "string"}),
        }
    )


_ACTIONS: dict[str, Action] = {"block": "block", "warn": "warn", "filter": "drop"}


class Moderation(InputHook, StreamHook):
    """Judges input messages and the streamed answer against moderation categories."""

    id = "moderation"
    name = "Moderation"
    description = "A judge model scores content against moderation categories (block, warn, filter)."
    Options = ModerationOptions

    async def verdict(self, text: str, options: ModerationOptions, model: Any, phase: Phase) -> Verdict:
        """Score `text`; flagged when a category reaches the threshold."""
        question = "Judge this content for moderation."
        answer = await ask(
            model,
            options,
            options.instructions or _instructions(options.categories),
            f"{question}\n{quoted(text, phase)}",
            _schema(options.categories),
            Question(text, phase, question),
        )
        scores, hits = scored(answer.get("category_scores"), "category", options.threshold)
        if not hits:
            return PASS
        reason = answer.get("reason")
        shown = scores if options.include_scores else None
        message = flag_message("Content flagged for moderation. Categories", hits, reason, shown)
        detail = self.detail(options, phase, categories=hits, scores=scores, reason=reason)
        return Verdict(_ACTIONS[options.strategy], message, detail)
