"""Memory's token budget on history (the reference's ``messageHistory: {maxTokens,
atMaxRemoveTokens}``, @mastra/core 1.71 ``memory/message-history-config.ts``,
``load-message-history.ts`` and the ``memory-token-limiter`` of ``memory.ts``).

Loading: the thread's messages after the saved boundary, newest first, in pages of 40, until a
page goes past the point where the history alone (tool-linked messages counted together) would
exceed ``maxTokens - atMaxRemoveTokens``; what was read is loaded, over-budget part included.
Trimming, once memory's input processors ran: the prompt is counted (24 for the conversation,
each system message, every message: loaded, recalled and this call's); over ``maxTokens``, the
oldest loaded or recalled message groups go until it is at most ``maxTokens - atMaxRemoveTokens``.
System messages and this call's messages are never removed. The newest removed message becomes
the thread's boundary (metadata ``memoryTokenLimiter``, unless memory is read-only): later calls
load nothing older, so the trimmed part of a long thread is not read again. The stored messages
are never touched.

Counting is the reference memory's ``TokenCounter`` (``tokenx`` estimate per part, 3.8 per
message): `count_message`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from procmesh.tokenx import estimate_tokens

Message = dict[str, Any]

PAGE_SIZE = 40
"""The reference's history page (``DEFAULT_HISTORY_PAGE_SIZE``)."""
PER_MESSAGE = 3.8
PER_CONVERSATION = 24
BOUNDARY_KEY = "memoryTokenLimiter"
"""Where the boundary lives in the thread's metadata (the reference's key)."""


@dataclass(frozen=True)
class HistoryBudget:
    """A token budget for a call's context (system + history + this call); only history is cut."""

    max_tokens: float
    at_max_remove_tokens: float
    """How far under ``max_tokens`` a trim goes (default: a quarter of it)."""

    @classmethod
    def of(cls, max_tokens: float, at_max_remove_tokens: float | None = None) -> HistoryBudget:
        """The reference's checks (``normalizeMessageHistoryConfig``), its wording in the error."""
        if not math.isfinite(max_tokens) or max_tokens < 0:
            raise ValueError("messageHistory.maxTokens must be a finite non-negative number")
        if at_max_remove_tokens is not None and (
            not math.isfinite(at_max_remove_tokens) or not 0 <= at_max_remove_tokens <= max_tokens
        ):
            raise ValueError(
                "messageHistory.atMaxRemoveTokens must be a finite non-negative number "
                "no greater than maxTokens"
            )
        remove = max_tokens * 0.25 if at_max_remove_tokens is None else at_max_remove_tokens
        return cls(max_tokens, remove)

    @property
    def target(self) -> float:
        return self.max_tokens - self.at_max_remove_tokens

    def as_json(self) -> dict[str, float]:
        """``{maxTokens, atMaxRemoveTokens}`` as the reference writes them (100, not 100.0)."""
        return {
            "maxTokens": _number(self.max_tokens),
            "atMaxRemoveTokens": _number(self.at_max_remove_tokens),
        }


def _number(value: float) -> float:
    return int(value) if float(value).is_integer() else value


# -- counting (the reference memory's TokenCounter) ---------------------------------------------


def _js(value: Any, indent: int | None = None) -> str:
    """``JSON.stringify(value[, null, indent])`` for JSON data (integral floats as integers)."""

    def plain(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
            return int(v)
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    separators = (",", ": ") if indent else (",", ":")
    return json.dumps(plain(value), ensure_ascii=False, indent=indent, separators=separators)


def _signature(invocation: dict[str, Any]) -> tuple[int, float]:
    tokens, overhead = 0, 0.0
    if invocation.get("toolName"):
        tokens += estimate_tokens(str(invocation["toolName"]))
    args = invocation.get("args")
    if "args" in invocation:  # ``args !== undefined``: a JSON null counts as "null"
        if isinstance(args, str):
            tokens += estimate_tokens(args)
        else:
            tokens += estimate_tokens(_js(args))
            overhead -= 12
    return tokens, overhead


def _result_value(part: dict[str, Any], invocation: dict[str, Any]) -> Any:
    mastra = (part.get("providerMetadata") or {}).get("mastra")
    if isinstance(mastra, dict) and "modelOutput" in mastra:
        return mastra["modelOutput"]
    return invocation.get("result")


def _or(text: str | None, fallback: str) -> str:
    """`text` unless it is blank."""
    return text if text and text.strip() else fallback


def _invocation(part: dict[str, Any]) -> tuple[int, float, int]:
    """(tokens, overhead change, extra messages) of a ``tool-invocation`` part."""
    invocation = part.get("toolInvocation") or {}
    state = invocation.get("state")
    tokens, overhead = _signature(invocation)
    if state in ("call", "partial-call", "approval-requested"):
        return tokens, overhead, 0
    if state == "approval-responded":
        reason = (invocation.get("approval") or {}).get("reason")
        return tokens + (estimate_tokens(reason) if reason else 0), overhead, 1
    if state == "result":
        value = _result_value(part, invocation)
        if value is not None and (not isinstance(value, str) or value.strip()):
            tokens += estimate_tokens(value if isinstance(value, str) else _js(value, indent=2))
            if not isinstance(value, str):
                overhead -= 12
        elif invocation.get("isError"):
            tokens += estimate_tokens(_or(invocation.get("errorText"), "Tool execution failed"))
        else:
            tokens += estimate_tokens("[empty result]")
        return tokens, overhead, 1
    if state == "output-denied":
        reason = (invocation.get("approval") or {}).get("reason")
        return tokens + estimate_tokens(_or(reason, "Tool call was not approved by the user")), overhead, 1
    if state == "output-error":
        error = invocation.get("errorText")
        return tokens + estimate_tokens(_or(error, "Tool execution failed")), overhead, 1
    return estimate_tokens(_js(part)), 0.0, 0


def _part(part: dict[str, Any]) -> tuple[int, float, int]:
    kind = str(part.get("type") or "")
    if kind == "text":
        return estimate_tokens(str(part.get("text") or "")), 0.0, 0
    if kind == "tool-invocation":
        return _invocation(part)
    if kind.startswith("data-") or kind == "reasoning":
        return 0, 0.0, 0
    return estimate_tokens(_js(part)), 0.0, 0


def count_message(message: Message) -> int:
    """The reference memory's ``TokenCounter.countMessage``: the role, each part's estimate, 3.8
    per message (and per tool result, which the provider sees as a message of its own), rounded."""
    payload = estimate_tokens(str(message.get("role") or ""))
    overhead = PER_MESSAGE
    extra = 0
    content = message.get("content")
    if isinstance(content, str):
        payload += estimate_tokens(content)
    elif isinstance(content, dict):
        parts = content.get("parts")
        if content.get("content") and not isinstance(parts, list):
            payload += estimate_tokens(str(content["content"]))
        elif isinstance(parts, list):
            for part in parts:
                tokens, delta, more = _part(part)
                payload += tokens
                overhead += delta
                extra += more
    overhead += extra * PER_MESSAGE
    return math.floor(payload + overhead + 0.5)  # Math.round


def count_system(text: str) -> float:
    """A system message as the reference's limiter counts it (``"system" + content``, plus 3.8)."""
    return estimate_tokens("system" + text) + PER_MESSAGE


# -- tool-linked groups and the boundary ----------------------------------------------------------


def _call_ids(message: Message) -> set[str]:
    content = message.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    ids: set[str] = set()
    for part in parts or []:
        if part.get("type") == "tool-invocation":
            call_id = (part.get("toolInvocation") or {}).get("toolCallId")
            if call_id:
                ids.add(str(call_id))
    return ids


def linked_groups(messages: list[Message]) -> list[list[Message]]:
    """Messages sharing a tool call id, together (``groupLinkedToolMessages``), in the order of
    each group's first message."""
    parent = list(range(len(messages)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for index, message in enumerate(messages):
        for call_id in _call_ids(message):
            if call_id in first:
                left, right = find(first[call_id]), find(index)
                if left != right:
                    parent[right] = left
            else:
                first[call_id] = index
    groups: dict[int, list[Message]] = {}
    for index, message in enumerate(messages):
        groups.setdefault(find(index), []).append(message)
    return list(groups.values())


def millis(message: Message) -> int:
    """The message's ``createdAt`` as JavaScript's ``Date`` holds it (milliseconds)."""
    when = datetime.fromisoformat(str(message.get("createdAt")).replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return math.floor(when.timestamp() * 1000)


def _iso(ms: int) -> str:
    """``new Date(ms).toISOString()``."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


@dataclass(frozen=True)
class Boundary:
    """Where the history of a thread starts for this budget: nothing at or before ``created_at``
    is loaded, except messages of that very time not in ``message_ids``."""

    created_ms: int
    message_ids: tuple[str, ...]
    budget: HistoryBudget

    @classmethod
    def read(cls, metadata: dict[str, Any], budget: HistoryBudget) -> Boundary | None:
        """The thread's boundary when it was saved under this same budget (else none applies)."""
        value = metadata.get(BOUNDARY_KEY)
        if not isinstance(value, dict):
            return None
        ids, max_tokens, remove = (
            value.get("messageIds"),
            value.get("maxTokens"),
            value.get("atMaxRemoveTokens"),
        )
        try:
            created = millis({"createdAt": value.get("createdAt")})
        except (TypeError, ValueError):
            return None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return None
        if (max_tokens, remove) != (budget.max_tokens, budget.at_max_remove_tokens):
            return None
        return cls(created, tuple(ids), budget)

    def admits(self, message: Message) -> bool:
        """``isAfterMemoryTokenBoundary``."""
        at = millis(message)
        return at > self.created_ms or (at == self.created_ms and message.get("id") not in self.message_ids)

    def as_metadata(self) -> dict[str, Any]:
        return {
            "createdAt": _iso(self.created_ms),
            "messageIds": list(self.message_ids),
            **self.budget.as_json(),
        }


def advance(previous: Boundary | None, removed: list[Message], budget: HistoryBudget) -> Boundary | None:
    """``advanceMemoryTokenBoundary``: the boundary after `removed` went (never moving back)."""
    if not removed:
        return previous
    newest = max(millis(m) for m in removed)
    before = previous.created_ms if previous is not None else -math.inf
    if newest < before:
        return previous
    ids = [str(m.get("id")) for m in removed if millis(m) == newest]
    kept = list(previous.message_ids) if previous is not None and newest == before else []
    return Boundary(newest, tuple(dict.fromkeys(kept + ids)), budget)


# -- loading ---------------------------------------------------------------------------------------


def _partition(
    newest_first: list[Message], budget: HistoryBudget, max_messages: int | None
) -> tuple[set[str], str]:
    """The ids of the newest messages that fit the history's own budget (``partitionMessages``,
    tool-linked groups whole) and what ended it: ``tokens``, ``messages`` or nothing."""
    count, tokens = 0, 0.0
    kept: set[str] = set()
    for group in linked_groups(newest_first):
        group_tokens = sum(count_message(m) for m in group)
        by_count = max_messages is not None and count + len(group) > max_messages
        by_tokens = tokens + group_tokens > budget.target
        if by_count or by_tokens:
            return kept, "tokens" if by_tokens else "messages"
        count += len(group)
        tokens += group_tokens
        kept.update(m["id"] for m in group)
    return kept, ""


async def load(
    read_last: Callable[[int], Awaitable[list[Message]]],
    budget: HistoryBudget,
    boundary: Boundary | None,
    max_messages: int | None,
) -> list[Message]:
    """The history a budgeted call loads, oldest first (``loadMessageHistory`` with
    ``includeOverflow``): pages of `PAGE_SIZE` after the boundary, newest first, until a page's
    oldest message is older than the newest one over the history's budget. Over by tokens, all
    that was read loads (the trim decides); over by the count, only what fits."""
    pages = 1
    while True:
        wanted = PAGE_SIZE * pages
        tail = await read_last(wanted)
        after = [m for m in tail if boundary is None or boundary.admits(m)]
        newest_first = [m for m in reversed(after) if m.get("role") != "system"]
        kept, reason = _partition(newest_first, budget, max_messages)
        more = len(tail) == wanted and len(after) == len(tail)
        over = [m for m in newest_first if m["id"] not in kept]
        crossed = bool(over) and bool(newest_first) and millis(newest_first[-1]) < millis(over[0])
        if more and not crossed:
            pages += 1
            continue
        if reason != "tokens":
            newest_first = [m for m in newest_first if m["id"] in kept]
        return list(reversed(newest_first))


# -- trimming --------------------------------------------------------------------------------------


def trim(
    budget: HistoryBudget, system_texts: list[str], messages: list[Message], removable: set[str]
) -> list[Message]:
    """What goes from the prompt (``trimMemory``): nothing when the whole prompt fits
    ``maxTokens``; else the oldest groups of `removable` messages (loaded or recalled history),
    until it is at most ``maxTokens - atMaxRemoveTokens`` (or no such group is left)."""
    counts = {m["id"]: count_message(m) for m in messages}
    total = PER_CONVERSATION + sum(count_system(t) for t in system_texts) + sum(counts.values())
    if total <= budget.max_tokens:
        return []
    by_time = sorted(messages, key=millis)  # stable: equal times keep the prompt's order
    removed: list[Message] = []
    for group in linked_groups(by_time):
        if total <= budget.target:
            break
        if all(m["id"] in removable for m in group):
            removed += group
            total -= sum(counts[m["id"]] for m in group)
    return removed
