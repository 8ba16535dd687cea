"""`pii-detector`: a judge model finds personally identifiable information; the guard blocks, warns,
filters or redacts it (the reference's PIIDetector).

Input lane: each input message, one call. Output lane: the streamed answer per window (redacted
windows leave as one text delta). The judge lists each detection's type, value and confidence;
the guard redacts every occurrence of a detected value itself, by `redaction_method`, so the
method is honoured whatever the model writes. Flagged when a detection's confidence (or, without
detections, a type's score) reaches `threshold`. A redaction with nothing to redact (the values are
not in the text) keeps an input message as it was and drops a window, as the reference does.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

from pydantic import Field

from procmesh_sidecars.builtins.guards._judge import (
    GuardOptions,
    InputHook,
    Phase,
    Question,
    StreamHook,
    ask,
    nullable,
    quoted,
    scored,
    verdict_object,
)
from procmesh_sidecars.builtins.guards._verdicts import PASS, Action, Verdict

DEFAULT_DETECTION_TYPES = [
    "email",
    "phone",
    "credit-card",
    "ssn",
    "api-key",
    "ip-address",
    "name",
    "address",
    "date-of-birth",
    "url",
    "uuid",
    "crypto-wallet",
    "iban",
]
"""The reference's default PII types."""


class PIIOptions(GuardOptions):
    """Options of `pii-detector`."""

    detection_types: list[str] = Field(default_factory=lambda: list(DEFAULT_DETECTION_TYPES), min_length=1)
    threshold: float = Field(default=0.6, ge=0, le=1)
    strategy: Literal["block", "warn", "filter", "redact"] = "redact"
    redaction_method: Literal["mask", "hash", "remove", "placeholder"] = "mask"
    """``mask``: asterisks (format kept, see `preserve_format`); ``hash``: ``[HASH:<8 hex of
    SHA-256>]``; ``remove``: deleted; ``placeholder``: ``[EMAIL]``, ``[PHONE]``, ..."""
    preserve_format: bool = True
    """With ``mask``: keep the value's shape (``j**e@*******.com``, ``XXX-XXX-4567``); otherwise up
    to 8 asterisks."""
    include_detections: bool = False
    """Say how many values were found in the violation message."""


def _instructions(types: list[str]) -> str:
    listed = "\n".join(f"- {t}" for t in types)
    return (
        "You find personally identifiable information (PII) in text, for privacy compliance. "
        f"Look for these types:\n{listed}\n\n"
        "For each value found, give its type, the value exactly as it appears in the text, and your "
        "confidence from 0 to 1; also score each type found. When there is no PII, give empty lists."
    )


def _schema(types: list[str]) -> dict[str, Any]:
    score = verdict_object({"type": {"enum": types}, "score": {"type": "number", "minimum": 0, "maximum": 1}})
    detection = verdict_object(
        {
            "type": {"type": "string"},
            "value": {"type": "string"},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        }
    )
    return verdict_object(
        {
            "categories": nullable({"type": "array", "items": score}),
            "detections": nullable({"type": "array", "items": detection}),
        }
    )


def _keep_last(value: str, keep: int, fill: str) -> str:
    """Digits replaced by `fill` except in the last `keep` characters (separators stay)."""
    cut = len(value) - keep
    return "".join(fill if ch.isdigit() and i < cut else ch for i, ch in enumerate(value))


def mask(value: str, kind: str, preserve_format: bool) -> str:
    """`value` masked with asterisks, in the shape of its type when `preserve_format`."""
    if not preserve_format:
        return "*" * min(len(value), 8)
    if kind == "email" and value.count("@") == 1:
        local, domain = value.split("@")
        local_masked = local[0] + "*" * (len(local) - 2) + local[-1] if len(local) > 2 else "***"
        host, dot, rest = domain.partition(".")
        domain_masked = "*" * len(host) + dot + rest if dot else "***"
        return f"{local_masked}@{domain_masked}"
    if kind == "phone":
        return _keep_last(value, 4, "X")
    if kind in ("credit-card", "ssn"):
        return _keep_last(value, 4, "*")
    if kind == "uuid":
        return re.sub(r"[0-9a-fA-F]", "*", value)
    if kind == "crypto-wallet":
        return value[:4] + "*" * (len(value) - 8) + value[-4:] if len(value) > 8 else "*" * len(value)
    if kind == "iban":
        return value[:2] + "*" * (len(value) - 6) + value[-4:] if len(value) > 6 else "*" * len(value)
    if len(value) <= 3:
        return "*" * len(value)
    return value[0] + "*" * (len(value) - 2) + value[-1]


def redact_value(value: str, kind: str, options: PIIOptions) -> str:
    """One value as `options.redaction_method` redacts it."""
    method = options.redaction_method
    if method == "hash":
        return f"[HASH:{hashlib.sha256(value.encode()).hexdigest()[:8]}]"
    if method == "remove":
        return ""
    if method == "placeholder":
        return f"[{kind.upper()}]"
    return mask(value, kind, options.preserve_format)


def redact(text: str, detections: list[tuple[str, str]], options: PIIOptions) -> str | None:
    """`text` with every occurrence of each detected ``(type, value)`` redacted; None if none occurs.

    Overlapping occurrences merge into one region, redacted as its longest value's type.
    """
    spans: list[tuple[int, int, str]] = []
    for kind, value in detections:
        if value:
            spans += [(m.start(), m.end(), kind) for m in re.finditer(re.escape(value), text)]
    if not spans:
        return None
    regions: list[tuple[int, int, str]] = []
    for start, end, kind in sorted(spans, key=lambda s: (s[0], s[0] - s[1])):
        if regions and start < regions[-1][1]:
            r_start, r_end, r_kind = regions[-1]
            longer = end - start > r_end - r_start
            regions[-1] = (r_start, max(r_end, end), kind if longer else r_kind)
        else:
            regions.append((start, end, kind))
    out, pos = [], 0
    for start, end, kind in regions:
        out += [text[pos:start], redact_value(text[start:end], kind, options)]
        pos = end
    out.append(text[pos:])
    return "".join(out)


_ACTIONS: dict[str, Action] = {"block": "block", "warn": "warn", "filter": "drop", "redact": "replace"}


class PIIDetector(InputHook, StreamHook):
    """Finds PII in input messages and the streamed answer."""

    id = "pii-detector"
    name = "PII Detector"
    description = "A judge model finds PII (block, warn, filter, redact by mask, hash, remove, placeholder)."
    Options = PIIOptions

    async def verdict(self, text: str, options: PIIOptions, model: Any, phase: Phase) -> Verdict:
        """Find PII in `text`; flagged when a detection (or type) reaches the threshold."""
        question = "Find the PII in this content."
        answer = await ask(
            model,
            options,
            options.instructions or _instructions(options.detection_types),
            f"{question}\n{quoted(text, phase)}",
            _schema(options.detection_types),
            Question(text, phase, question),
        )
        found = [d for d in answer.get("detections") or [] if float(d["confidence"]) >= options.threshold]
        scores, over = scored(answer.get("categories"), "type", options.threshold)
        # detections decide when there are any, else the type scores (as in the reference)
        if not (found if answer.get("detections") else over):
            return PASS
        types = list(dict.fromkeys([*(str(d["type"]) for d in found), *over]))
        message = f"PII detected. Types: {', '.join(types)}"
        if options.include_detections:
            message += f". Detections: {len(found)} items"
        detail = self.detail(
            options,
            phase,
            types=types,
            # the values themselves never leave in a violation: they are what is being protected
            detections=[{"type": d["type"], "confidence": d["confidence"]} for d in found],
            scores=scores,
        )
        if options.strategy != "redact":
            return Verdict(_ACTIONS[options.strategy], message, detail)
        redacted = redact(text, [(str(d["type"]), str(d["value"])) for d in found], options)
        if redacted is not None:
            return Verdict("replace", message, detail, text=redacted)
        if phase == "input":
            return Verdict("warn", message + ". No redaction available: kept as it was", detail)
        return Verdict("drop", message + ". No redaction available: the text is removed", detail)
