"""Example processors (the demo's): each one shows a hook of the seeds at work."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from procmesh import Processor
from procmesh_sidecars.builtins._linear_re import DIGIT, WORD, compile_pattern, escape

Message = dict[str, Any]
# RE2, not `re`: backtracking made the e-mail pattern quadratic (14 s of CPU on 60,000 characters
# without a space), and an example is copied. WORD and DIGIT are `re`'s Unicode \w and \d.
_EMAIL = compile_pattern(rf"[{WORD}.+-]+@[{WORD}-]+\.[{WORD}.]+")
_PHONE = compile_pattern(rf"\+?{DIGIT}[{DIGIT} -]{{7,}}{DIGIT}")


def _map_text(messages: list[Message], fn: Any) -> list[Message]:
    out = []
    for msg in messages:
        parts = [
            {**p, "text": fn(p["text"])} if p.get("type") == "text" else p for p in msg["content"]["parts"]
        ]
        out.append({**msg, "content": {**msg["content"], "parts": parts}})
    return out


class PiiRedactor(Processor):
    """Rewrites e-mail addresses and phone numbers in the input before the model sees them."""

    id = "pii-redactor"
    description = "Redacts e-mail addresses and phone numbers in user input."

    async def process_input(self, messages: list[Message]) -> list[Message]:
        return _map_text(messages, lambda t: _PHONE.sub("[phone]", _EMAIL.sub("[email]", t)))


class TopicGuardOptions(BaseModel):
    """Options of `topic-guard`."""

    words: list[str] = ["jailbreak"]


class TopicGuard(Processor):
    """Blocks the run (tripwire) when the input holds a forbidden word."""

    id = "topic-guard"
    description = "Aborts when the user input contains a blocked word."
    Options = TopicGuardOptions

    async def process_input(self, messages: list[Message], options: TopicGuardOptions, abort: Any) -> None:
        text = " ".join(p.get("text", "") for m in messages for p in m["content"]["parts"]).lower()
        for word in options.words:
            if word.lower() in text:
                abort(f"Blocked: the request mentions '{word}'", metadata={"category": "topic", "word": word})


class WordFilterOptions(BaseModel):
    """Options of `word-filter`."""

    words: list[str] = ["darn"]


class WordFilter(Processor):
    """Masks words in the streamed output, chunk by chunk."""

    id = "word-filter"
    description = "Replaces listed words in streamed text with asterisks."
    Options = WordFilterOptions

    async def process_output_stream(self, part: dict[str, Any], options: WordFilterOptions) -> dict[str, Any]:
        if part["type"] != "text-delta":
            return part
        text = part["payload"]["text"]
        for word in options.words:
            pattern = compile_pattern(escape(word), ignore_case=True)
            text = pattern.sub(lambda m: "*" * len(m.group(0)), text)
        return {**part, "payload": {**part["payload"], "text": text}}


class LengthCheckOptions(BaseModel):
    """Options of `length-check`."""

    max_words: int = 12


class LengthCheck(Processor):
    """Rejects long answers and asks the model to retry with feedback."""

    id = "length-check"
    description = "Asks for a shorter answer (retry with feedback) when a step's text is too long."
    Options = LengthCheckOptions

    async def process_output_step(
        self, text: str, retry_count: int, options: LengthCheckOptions, abort: Any
    ) -> None:
        words = len(text.split())
        if words > options.max_words and retry_count < 2:
            abort(
                f"Answer in at most {options.max_words} words.",
                retry=True,
                metadata={"words": words, "limit": options.max_words},
            )


class WordCounter(Processor):
    """Counts streamed words in its state and reports them at the end (a custom chunk and metadata)."""

    id = "word-counter"
    description = "Counts words across chunks; emits data-word-count and tags the answer."

    async def process_output_stream(self, part: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        if part["type"] == "text-delta":
            state["words"] = state.get("words", 0) + len(part["payload"]["text"].split())
        return part

    async def process_output_result(
        self, messages: list[Message], state: dict[str, Any], writer: Any
    ) -> list[Message]:
        await writer.custom({"type": "data-word-count", "data": {"words": state.get("words", 0)}})
        out = []
        for msg in messages:
            if msg["role"] == "assistant":
                meta = {**(msg["content"].get("metadata") or {}), "wordCount": state.get("words", 0)}
                msg = {**msg, "content": {**msg["content"], "metadata": meta}}
            out.append(msg)
        return out


def processors() -> list[Processor]:
    """Every example processor."""
    return [PiiRedactor(), TopicGuard(), WordFilter(), LengthCheck(), WordCounter()]
