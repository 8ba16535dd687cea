"""`regex-filter`: blocks, redacts or warns on regex matches in input and output. No model calls.

Every pattern, preset or user-given, runs on RE2 (`_linear_re`): matching costs time linear in the
text, so no input can make a hook spin (Python's `re` took seconds on the old e-mail preset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from procmesh import Processor
from procmesh_sidecars.builtins._common import Chunk, Message, map_message_text
from procmesh_sidecars.builtins._linear_re import SPACE, Pattern, PatternError, compile_pattern

Preset = Literal["pii", "secrets", "urls"]


class RegexRule(BaseModel):
    """One rule: a name (reported), a pattern and the redaction replacement; another key is an
    error naming it (a misspelt ``replacement`` would redact with the default)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    pattern: str
    """A regular expression in RE2 syntax (the usual JavaScript patterns work; ``\\d``, ``\\w``,
    ``\\s`` and ``\\b`` are ASCII). Backreferences and lookaround are refused: they need
    backtracking, whose time can grow exponentially with the text."""
    replacement: str = "[REDACTED]"
    flags: str = "g"
    """JavaScript-style flags: ``i`` ignore case, ``m`` multiline, ``s`` dot-all; without ``g``
    only the first match counts."""
    _compiled: Pattern = PrivateAttr()

    @field_validator("flags")
    @classmethod
    def _flags(cls, value: str) -> str:
        unknown = set(value) - set("gimsuy")
        if unknown:
            raise ValueError(f"unknown regex flags {sorted(unknown)}")
        return value

    @model_validator(mode="after")
    def _compiles(self) -> RegexRule:
        # Compiled once here (options are validated once per distinct options value), so a
        # pattern RE2 refuses is an options error naming the rule, never a failure mid-run.
        try:
            self._compiled = compile_pattern(
                self.pattern,
                ignore_case="i" in self.flags,
                multiline="m" in self.flags,
                dot_all="s" in self.flags,
            )
        except PatternError as exc:
            raise ValueError(
                f"rule {self.name!r}: invalid pattern {self.pattern!r}: {exc} (patterns are RE2 "
                "syntax, which has no backreferences or lookaround)"
            ) from None
        return self

    @property
    def compiled(self) -> Pattern:
        """The pattern compiled with the rule's flags."""
        return self._compiled


# SPACE is Python's Unicode \s, which these presets meant under `re` (RE2's \s is ASCII). Their \d
# and \b are RE2's ASCII ones, as in the JavaScript reference the presets come from.
PRESETS: dict[str, list[RegexRule]] = {
    "pii": [
        RegexRule(
            name="email", pattern=r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}", replacement="[EMAIL]"
        ),
        RegexRule(
            name="phone",
            pattern=rf"(?:\+?1[-.{SPACE}]?)?\(?[0-9]{{3}}\)?[-.{SPACE}]?[0-9]{{3}}[-.{SPACE}]?[0-9]{{4}}",
            replacement="[PHONE]",
        ),
        RegexRule(name="ssn", pattern=r"\b\d{3}-\d{2}-\d{4}\b", replacement="[SSN]"),
        RegexRule(
            name="credit-card",
            pattern=rf"\b(?:\d{{4}}[-{SPACE}]?){{3}}\d{{4}}\b",
            replacement="[CREDIT_CARD]",
        ),
    ],
    "secrets": [
        RegexRule(
            name="api-key",
            pattern=rf"""(?:api[_-]?key|apikey|api[_-]?secret)[{SPACE}]*[:=][{SPACE}]*["']?[a-zA-Z0-9_\-]{{20,}}["']?""",
            replacement="[API_KEY]",
            flags="gi",
        ),
        RegexRule(
            name="bearer-token",
            pattern=rf"Bearer[{SPACE}]+[a-zA-Z0-9_\-.]+",
            replacement="[BEARER_TOKEN]",
            flags="gi",
        ),
        RegexRule(name="aws-key", pattern=r"(?:AKIA|ASIA)[A-Z0-9]{16}", replacement="[AWS_KEY]"),
    ],
    "urls": [
        RegexRule(
            name="url", pattern=rf"""https?://[^{SPACE}<>"{{}}|\\^`\[\]]+""", replacement="[URL]", flags="gi"
        ),
    ],
}


class RegexFilterOptions(BaseModel):
    """Options of `regex-filter` (at least one rule or preset)."""

    rules: list[RegexRule] = []
    presets: list[Preset] = []
    """``pii`` (email, phone, ssn, credit-card), ``secrets`` (api-key, bearer-token, aws-key), ``urls``."""
    strategy: Literal["block", "redact", "warn"] = "block"
    phase: Literal["input", "output", "all"] = "all"
    include_redacted_values: bool = False
    """Report the matched text in the tripwire metadata (default ``[REDACTED_MATCH]``)."""
    stream_carryover_size: int = Field(default=128, ge=0)
    """Characters of earlier streamed text kept as context, so a match split across chunks is found."""
    stream_hold_back: int = Field(default=0, ge=0)
    """Characters of streamed text held back until the next chunk (or the step's end), so a match
    split across chunks is redacted or blocked before any of it is sent (0: no hold-back)."""

    @model_validator(mode="after")
    def _some_rule(self) -> RegexFilterOptions:
        if not self.rules and not self.presets:
            raise ValueError("regex-filter needs at least one rule or preset")
        return self


@dataclass(frozen=True)
class Match:
    """One match: the rule, where it is and what it covers."""

    rule: RegexRule
    start: int
    end: int
    text: str


def all_rules(options: RegexFilterOptions) -> list[RegexRule]:
    """Preset rules first, then the custom ones (the reference's order)."""
    return [r for p in options.presets for r in PRESETS[p]] + list(options.rules)


def find_matches(text: str, rules: list[RegexRule]) -> list[Match]:
    """Every match of every rule (only the first one for a rule without the ``g`` flag)."""
    out: list[Match] = []
    for rule in rules:
        for m in rule.compiled.finditer(text):
            if m.end() > m.start():
                out.append(Match(rule, m.start(), m.end(), m.group(0)))
                if "g" not in rule.flags:
                    break
    return out


def regions(matches: list[Match]) -> list[tuple[int, int, Match]]:
    """Overlapping matches merged into regions, each owned by its longest match."""
    merged: list[tuple[int, int, Match]] = []
    for m in sorted(matches, key=lambda m: (m.start, -(m.end - m.start))):
        if merged and m.start < merged[-1][1]:
            start, end, owner = merged[-1]
            if m.end - m.start > owner.end - owner.start:
                owner = m
            merged[-1] = (start, max(end, m.end), owner)
        else:
            merged.append((m.start, m.end, m))
    return merged


def redact(text: str, rules: list[RegexRule]) -> str:
    """`text` with every region replaced by its owner's replacement."""
    out = []
    pos = 0
    for start, end, owner in regions(find_matches(text, rules)):
        out.append(text[pos:start])
        out.append(owner.rule.replacement)
        pos = end
    out.append(text[pos:])
    return "".join(out)


class RegexFilter(Processor):
    """Regex guardrail for input (``processInput``), the stream and the final result."""

    id = "regex-filter"
    name = "Regex Filter"
    description = "Blocks, redacts or warns on regex matches (presets: pii, secrets, urls)."
    Options = RegexFilterOptions

    def _report(
        self, matches: list[Match], options: RegexFilterOptions, offset: int = 0
    ) -> list[dict[str, Any]]:
        return [
            {
                "rule": m.rule.name,
                "match": m.text if options.include_redacted_values else "[REDACTED_MATCH]",
                "index": m.start - offset,
            }
            for m in matches
        ]

    def _handle(
        self, matches: list[Match], options: RegexFilterOptions, context: str, abort: Any, report: Any
    ) -> None:
        names = ", ".join(dict.fromkeys(m.rule.name for m in matches))
        if options.strategy == "block":
            abort(
                f"Regex filter: blocked {context} matching patterns: {names}",
                metadata={
                    "processorId": self.id,
                    "matches": self._report(matches, options),
                    "strategy": "block",
                },
            )
        verb = "redacted" if options.strategy == "redact" else "matched"
        report(
            f"Regex filter: {verb} {context} matching patterns: {names}",
            {
                "processorId": self.id,
                "strategy": options.strategy,
                "matches": [
                    {"rule": m.rule.name, "index": m.start, "length": m.end - m.start}
                    | ({"match": m.text} if options.include_redacted_values else {})
                    for m in matches
                ],
            },
        )

    def _messages(
        self, messages: list[Message], options: RegexFilterOptions, abort: Any, report: Any
    ) -> list[Message] | None:
        rules = all_rules(options)
        texts = [
            p["text"]
            for m in messages
            for p in (m.get("content") or {}).get("parts") or []
            if p.get("type") == "text" and p.get("text")
        ]
        matches = find_matches("\n".join(texts), rules)
        if not matches:
            return None
        self._handle(matches, options, "content", abort, report)
        if options.strategy != "redact":
            return None
        return [map_message_text(m, lambda t: redact(t, rules)) for m in messages]

    async def process_input(
        self, messages: list[Message], options: RegexFilterOptions, abort: Any, report_violation: Any
    ) -> list[Message] | None:
        if options.phase == "output":
            return None
        return self._messages(messages, options, abort, report_violation)

    async def process_output_stream(
        self,
        part: Chunk,
        options: RegexFilterOptions,
        state: dict[str, Any],
        abort: Any,
        report_violation: Any,
    ) -> Chunk | list[Chunk] | None:
        if options.phase == "input":
            return part
        if options.stream_hold_back:
            return self._held_stream(part, options, state, abort, report_violation)
        if part.get("type") != "text-delta":
            return part
        delta = str((part.get("payload") or {}).get("text", ""))
        if not delta:
            return part
        carry = str(state.get("carry", ""))
        combined = carry + delta
        keep = options.stream_carryover_size
        state["carry"] = combined[-keep:] if keep else ""
        rules = all_rules(options)
        offset = len(carry)
        # Matches wholly inside the carried text were handled with an earlier chunk.
        matches = [m for m in find_matches(combined, rules) if m.end > offset]
        if not matches:
            return part
        self._handle(matches, options, "streaming content", abort, report_violation)
        if options.strategy != "redact":
            return part
        out = []
        pos = offset
        for start, end, owner in regions(matches):
            if end <= offset:
                continue
            out.append(combined[pos : max(start, offset)])
            out.append(owner.rule.replacement)  # a match begun in an earlier chunk: only its tail is hidden
            pos = end
        out.append(combined[pos:])
        return {**part, "payload": {**part["payload"], "text": "".join(out)}}

    def _held_stream(
        self, part: Chunk, options: RegexFilterOptions, state: dict[str, Any], abort: Any, report: Any
    ) -> Chunk | list[Chunk] | None:
        """Hold the last `stream_hold_back` characters back; any other part releases them first."""
        if part.get("type") != "text-delta":
            held = self._release(state, "", options, abort, report, final=True)
            return [held, part] if held is not None else part
        state["heldId"] = (part.get("payload") or {}).get("id", state.get("heldId", ""))
        delta = str((part.get("payload") or {}).get("text", ""))
        return self._release(state, delta, options, abort, report, final=False)

    def _release(
        self,
        state: dict[str, Any],
        delta: str,
        options: RegexFilterOptions,
        abort: Any,
        report: Any,
        *,
        final: bool,
    ) -> Chunk | None:
        """Emit what is safe of the held text plus `delta` (all of it when `final`) as one text delta."""
        carry = str(state.get("carry", ""))
        pending = str(state.get("held", "")) + delta
        if not pending:
            return None
        combined = carry + pending
        offset = len(carry)
        found = regions([m for m in find_matches(combined, all_rules(options)) if m.end > offset])
        cut = len(combined) if final else max(offset, len(combined) - options.stream_hold_back)
        for start, end, _ in found:
            if start < cut < end and start >= offset:  # never cut through a match: hold all of it
                cut = start
        emitted = [(s, e, o) for s, e, o in found if e <= cut]
        if emitted:
            self._handle([o for _, _, o in emitted], options, "streaming content", abort, report)
        out, pos = [], offset
        for start, end, owner in emitted:
            if options.strategy == "redact":
                out.append(combined[pos : max(start, offset)])
                out.append(owner.rule.replacement)
                pos = end
        out.append(combined[pos:cut])
        keep = options.stream_carryover_size
        state["carry"] = combined[:cut][-keep:] if keep else ""
        state["held"] = combined[cut:]
        text = "".join(out)
        if not text:
            return None
        payload: dict[str, Any] = {"text": text}
        if state.get("heldId"):
            payload["id"] = state["heldId"]
        return {"type": "text-delta", "payload": payload}

    async def process_output_result(
        self, messages: list[Message], options: RegexFilterOptions, abort: Any, report_violation: Any
    ) -> list[Message] | None:
        if options.phase == "input":
            return None
        return self._messages(messages, options, abort, report_violation)
