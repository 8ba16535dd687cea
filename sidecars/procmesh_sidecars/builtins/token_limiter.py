"""`token-limiter`: keeps the prompt within a token budget; truncates or stops over-long output.

Input lane (``processLLMRequest``): trims the provider prompt for this call only
(stored history untouched). With ``trim_mode: memory-only`` it trims nothing there and
instead, in ``processInput``, drops the oldest loaded memory history (whole tool-linked
groups, never this call's input) until the messages fit ``limit - at_max_remove_tokens``.
Loaded history is recognised by its ``threadId``: the store stamps it on every message it
saves (store contract, ``save_turn``) and the run never sets it on a call's input, which
comes after the history (SPEC §2). System messages are always kept; the rest is kept
newest first, an assistant message travels with the tool message(s) answering
its calls, and this run's tool calls and results are never dropped. When
nothing fits, the run ends with a tripwire that says why.

Output lane: ``processOutputStream`` counts ``text-delta`` / ``object`` chunks
and, past the limit, withholds them (``truncate``, with one transient
``data-token-limit-reached`` notice) or aborts (``abort``);
``processOutputResult`` cuts the final text to the limit.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from procmesh import Processor
from procmesh_sidecars.builtins._common import Chunk, Message, PromptMessage, js_stringify, prompt_parts
from procmesh_sidecars.builtins.tokens import CounterName, EncodingName, TokenCounter

TOKENS_PER_IMAGE = 765
TOKENS_PER_MEDIA_FALLBACK = 258
BYTES_PER_TOKEN = 4
_OUTPUT_CHUNKS = ("text-delta", "object")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


class TokenLimiterOptions(BaseModel):
    """Options of `token-limiter` (the reference's names in snake_case)."""

    limit: int = Field(gt=0)
    """Maximum tokens: of the prompt (input lane) or of the generated output (output lane)."""
    strategy: Literal["truncate", "abort"] = "truncate"
    """Output over the limit: withhold it (`truncate`) or end the run (`abort`)."""
    count_mode: Literal["cumulative", "part"] = "cumulative"
    """Output: count from the start of the stream, or each chunk on its own."""
    trim_mode: Literal["best-fit", "contiguous", "memory-only"] = "best-fit"
    """Prompt: `best-fit` keeps trying older messages after one does not fit, `contiguous` stops
    at the first; `memory-only` trims loaded memory history only (in processInput, oldest first)."""
    at_max_remove_tokens: int | None = Field(default=None, ge=0)
    """`memory-only`: once over the limit, trim to this many tokens below it (default limit * 0.25)."""
    token_counter: CounterName = "tiktoken"
    """`tiktoken` counts real token ids; `estimate` is the reference's cheap heuristic."""
    encoding: EncodingName = "o200k_base"
    """The tiktoken encoding (`o200k_base` for GPT-4o and later, `cl100k_base` for GPT-4)."""

    @model_validator(mode="after")
    def _room(self) -> TokenLimiterOptions:
        if self.at_max_remove_tokens is not None and self.at_max_remove_tokens > self.limit:
            raise ValueError("at_max_remove_tokens cannot exceed limit (the reference refuses it too)")
        return self


class TokenLimiter(Processor):
    """Prompt trimming, output truncation and output limits by token count."""

    id = "token-limiter"
    name = "Token Limiter"
    description = "Keeps prompts within a token limit (newest first) and limits generated output."
    Options = TokenLimiterOptions

    def __init__(self) -> None:
        self._counters: dict[tuple[str, str], TokenCounter] = {}

    async def setup(self) -> None:
        self.counter(TokenLimiterOptions(limit=1))  # load the default encoding before SERVING

    def counter(self, options: TokenLimiterOptions) -> TokenCounter:
        """The counter the options ask for (cached per method and encoding)."""
        key = (options.token_counter, options.encoding)
        if key not in self._counters:
            self._counters[key] = TokenCounter(options.token_counter, options.encoding)
        return self._counters[key]

    # -- prompt ---------------------------------------------------------------------------

    def count_message(self, message: Message) -> float | None:
        """The seeds' ``tokenCounter.countMessage``: override in a subclass to count one message
        of ``memory-only`` trimming your way (None: the built-in count). Functions cannot travel as
        options, so your own sidecar hosts the subclass (docs/builtins.md, token-limiter)."""
        return None

    async def on_memory_trim(self, removed: list[Message], request_context: dict[str, Any]) -> None:
        """The seeds' ``onMemoryTrim``: override to see the loaded history ``memory-only`` trimming
        drops (oldest first), before it goes, e.g. to persist a memory cursor."""

    async def process_input(
        self,
        messages: list[Message],
        system_messages: list[Message],
        options: TokenLimiterOptions,
        request_context: dict[str, Any] | None = None,
    ) -> list[Message] | None:
        if options.trim_mode != "memory-only":
            return None
        counted = self.count_message if type(self).count_message is not TokenLimiter.count_message else None
        kept = trim_memory(messages, system_messages, options, self.counter(options), counted)
        if kept is not None:
            await self.on_memory_trim(messages[: len(messages) - len(kept)], request_context or {})
        return kept

    async def process_llm_request(
        self, prompt: list[PromptMessage], options: TokenLimiterOptions, state: dict[str, Any], abort: Any
    ) -> dict[str, Any] | None:
        history = state.get("historyToolCallIds")
        if history is None:  # the first prompt of the run: every tool call in it is history
            history = sorted(_tool_call_ids(prompt))
            state["historyToolCallIds"] = history
        if options.trim_mode == "memory-only":
            return None
        return trim_prompt(prompt, options, self.counter(options), set(history), abort)

    # -- output ---------------------------------------------------------------------------

    async def process_output_stream(
        self,
        part: Chunk,
        options: TokenLimiterOptions,
        state: dict[str, Any],
        abort: Any,
        writer: Any,
    ) -> Chunk | None:
        if part.get("type") not in _OUTPUT_CHUNKS:
            return part
        counter = self.counter(options)
        tokens = counter.count(_chunk_text(part))
        previous = int(state.get("currentTokens") or 0)
        current = previous + tokens if options.count_mode == "cumulative" else tokens
        state["currentTokens"] = 0 if options.count_mode == "part" else current
        if current <= options.limit:
            return part
        if options.strategy == "abort":
            abort(
                f"Token limit of {options.limit} exceeded (current: {current})",
                metadata={"limit": options.limit, "tokens": current},
            )
        if not state.get("limitReachedNotified"):
            state["limitReachedNotified"] = True
            await writer.custom(
                {
                    "type": "data-token-limit-reached",
                    "data": {"processorId": self.id, "limit": options.limit, "tokens": current},
                    "transient": True,
                }
            )
        # The chunk that crosses the limit keeps the text that still fits (the reference drops it
        # whole, which in generate(), where the answer is one chunk, would drop the whole answer).
        room = options.limit - (previous if options.count_mode == "cumulative" else 0)
        if part.get("type") == "text-delta" and room > 0:
            cut = counter.slice(_chunk_text(part), room)
            if cut:
                return {**part, "payload": {**part["payload"], "text": cut}}
        return None

    async def process_output_result(
        self, messages: list[Message], options: TokenLimiterOptions, abort: Any
    ) -> list[Message] | None:
        counter = self.counter(options)
        used = 0
        changed = False
        out: list[Message] = []
        for msg in messages:
            parts = (msg.get("content") or {}).get("parts")
            if msg.get("role") != "assistant" or not isinstance(parts, list):
                out.append(msg)
                continue
            new_parts = []
            for part in parts:
                if part.get("type") != "text":
                    new_parts.append(part)
                    continue
                text = part.get("text", "")
                tokens = counter.count(text)
                if used + tokens <= options.limit:
                    used += tokens
                    new_parts.append(part)
                    continue
                if options.strategy == "abort":
                    abort(f"Token limit of {options.limit} exceeded (current: {used + tokens})")
                cut = counter.slice(text, max(0, options.limit - used))
                used += counter.count(cut)
                new_parts.append({**part, "text": cut})
                changed = True
            out.append({**msg, "content": {**msg["content"], "parts": new_parts}})
        return out if changed else None


def _chunk_text(part: Chunk) -> str:
    payload = part.get("payload") or {}
    if part.get("type") == "text-delta":
        return str(payload.get("text", ""))
    value = payload.get("object", payload)
    return js_stringify(value)


def _tool_call_ids(prompt: list[PromptMessage]) -> set[str]:
    return {
        str(p.get("toolCallId"))
        for m in prompt
        for p in prompt_parts(m)
        if p.get("type") in ("tool-call", "tool-result") and p.get("toolCallId")
    }


def media_tokens(data: Any, media_type: str | None) -> int:
    """The reference's estimate for a media payload: images are flat, other media bytes / 4."""
    if media_type and media_type.startswith("image/"):
        return TOKENS_PER_IMAGE
    size: int | None = None
    if isinstance(data, bytes | bytearray):
        size = len(data)
    elif isinstance(data, str):
        if data.startswith("data:"):
            b64 = data.partition(",")[2]
            size = (len(b64) * 3) // 4
        elif not _SCHEME.match(data):
            try:
                size = len(base64.b64decode(data, validate=False))
            except (binascii.Error, ValueError):
                size = (len(data) * 3) // 4
    if size is None:
        return TOKENS_PER_MEDIA_FALLBACK
    return max(1, size // BYTES_PER_TOKEN)


def _is_media(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("data"), str)
        and (isinstance(value.get("mediaType"), str) or isinstance(value.get("mimeType"), str))
    )


class _Costs:
    """Per-message token costs: tiktoken follows OpenAI's chat accounting, the estimator the reference's."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        if counter.exact:
            self.per_message, self.per_conversation, self.json_overhead = 3.0, 3.0, 0.0
        else:
            self.per_message, self.per_conversation, self.json_overhead = 3.8, 24.0, -12.0

    def message(self, msg: PromptMessage) -> float:
        role = str(msg.get("role", ""))
        if role == "system":
            return self.counter.count(role + str(msg.get("content", ""))) + self.per_message
        text = role
        overhead = self.per_message
        media = 0
        for part in prompt_parts(msg):
            kind = part.get("type")
            if kind in ("text", "reasoning"):
                text += str(part.get("text", ""))
            elif kind == "tool-call":
                text += str(part.get("toolName", ""))
                args = part.get("input")
                if isinstance(args, str):
                    text += args
                elif args is not None:
                    text += js_stringify(args)
                    overhead += self.json_overhead
            elif kind == "tool-result":
                output = part.get("output")
                if isinstance(output, str):
                    text += output
                elif isinstance(output, dict) and _is_media(output):
                    media += media_tokens(output["data"], output.get("mediaType") or output.get("mimeType"))
                    text += js_stringify({k: v for k, v in output.items() if k != "data"})
                    overhead += self.json_overhead
                elif output is not None:
                    text += js_stringify(output)
                    overhead += self.json_overhead
            elif kind == "file":
                media += media_tokens(part.get("data"), part.get("mediaType"))
            else:
                text += js_stringify(part)
        return self.counter.count(text) + overhead + media


def _groups(prompt: list[PromptMessage]) -> list[list[int]]:
    """Indexes of the non-system messages, grouped: an assistant message with tool calls plus the
    tool messages right after it whose results answer those calls."""
    groups: list[list[int]] = []
    i = 0
    while i < len(prompt):
        msg = prompt[i]
        if msg.get("role") == "system":
            i += 1
            continue
        group = [i]
        calls = {p.get("toolCallId") for p in prompt_parts(msg) if p.get("type") == "tool-call"}
        i += 1
        if msg.get("role") == "assistant" and calls:
            while i < len(prompt) and prompt[i].get("role") == "tool":
                results = {
                    p.get("toolCallId") for p in prompt_parts(prompt[i]) if p.get("type") == "tool-result"
                }
                if not results & calls:
                    break
                group.append(i)
                i += 1
        groups.append(group)
    return groups


def trim_prompt(
    prompt: list[PromptMessage],
    options: TokenLimiterOptions,
    counter: TokenCounter,
    history_call_ids: set[str],
    abort: Any,
) -> dict[str, Any] | None:
    """The reference's prompt-stage algorithm; returns ``{"prompt": ...}`` only when it dropped something."""
    costs = _Costs(counter)
    groups = _groups(prompt)
    if not groups:
        abort("TokenLimiterProcessor: No messages to process. Cannot send LLM a request with no messages.")
    limit = options.limit
    system_tokens = sum(costs.message(m) for m in prompt if m.get("role") == "system")
    if system_tokens + costs.per_conversation >= limit:
        abort(
            "TokenLimiterProcessor: System messages alone exceed token limit. "
            "Requests cannot be completed by removing system messages.",
            metadata={"systemTokens": system_tokens, "limit": limit},
        )
    budget = limit - system_tokens - costs.per_conversation

    def protected(group: list[int]) -> bool:
        ids = {
            p.get("toolCallId")
            for i in group
            for p in prompt_parts(prompt[i])
            if p.get("type") in ("tool-call", "tool-result")
        }
        return bool(ids - history_call_ids - {None})

    keep: set[int] = set()
    used = 0.0
    for g, group in enumerate(groups):  # this run's tool traffic is counted first and always kept
        if protected(group):
            keep.add(g)
            used += sum(costs.message(prompt[i]) for i in group)
    for g in range(len(groups) - 1, -1, -1):  # then the rest, newest first
        if g in keep:
            continue
        tokens = sum(costs.message(prompt[i]) for i in groups[g])
        if used + tokens <= budget:
            keep.add(g)
            used += tokens
        elif options.trim_mode == "contiguous":
            break
    if not keep:
        abort(
            "TokenLimiterProcessor: No messages fit within the remaining token budget. "
            "Cannot send LLM a request with no messages.",
            metadata={
                "systemTokens": system_tokens,
                "limit": limit,
                "remainingBudget": budget,
                "messageCount": sum(len(g) for g in groups),
            },
        )
    if len(keep) == len(groups):
        return None
    kept_indexes = {i for g in keep for i in groups[g]}
    return {"prompt": [m for i, m in enumerate(prompt) if m.get("role") == "system" or i in kept_indexes]}


def _db_as_prompt(msg: Message) -> PromptMessage:
    """A stored (format 2) message in the prompt's shape, so both lanes count tokens alike."""
    content = msg.get("content") or {}
    if isinstance(content, str) or msg.get("role") == "system":
        return {"role": msg.get("role", ""), "content": _text_of(content)}
    parts: list[dict[str, Any]] = []
    for part in content.get("parts") or []:
        if part.get("type") != "tool-invocation":
            parts.append(part)
            continue
        inv = part.get("toolInvocation") or {}
        ids = {"toolCallId": inv.get("toolCallId"), "toolName": inv.get("toolName")}
        parts.append({"type": "tool-call", **ids, "input": inv.get("args")})
        if inv.get("state") == "result":
            parts.append({"type": "tool-result", **ids, "output": inv.get("result")})
    return {"role": msg.get("role", ""), "content": parts}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content.get("parts") or [] if p.get("type") == "text")


def _loaded_count(messages: list[Message]) -> int:
    """How many leading messages are loaded history: those the store stamped with a thread, up to
    (never including) the last user message, which is this call's question."""
    count = 0
    while count < len(messages) and messages[count].get("threadId"):
        count += 1
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages))
    return min(count, last_user)


def trim_memory(
    messages: list[Message],
    system_messages: list[Message],
    options: TokenLimiterOptions,
    counter: TokenCounter,
    count_message: Callable[[Message], float | None] | None = None,
) -> list[Message] | None:
    """`memory-only`: the loaded history, oldest first in tool-linked groups, goes until the messages
    fit ``limit - at_max_remove_tokens``; None when they already fit the limit (or nothing is loaded).
    `count_message` counts a message instead of the built-in count (unless it answers None)."""
    costs = _Costs(counter)
    loaded = _loaded_count(messages)

    def count(message: Message) -> float:
        own = count_message(message) if count_message is not None else None
        return costs.message(_db_as_prompt(message)) if own is None else own

    cost = [count(m) for m in messages]
    total = costs.per_conversation + sum(cost) + sum(costs.message(_db_as_prompt(m)) for m in system_messages)
    if total <= options.limit or loaded == 0:
        return None
    free = options.at_max_remove_tokens
    target = options.limit - (options.limit * 0.25 if free is None else free)
    drop = 0
    while drop < loaded and total > target:
        calls = _tool_call_ids([_db_as_prompt(messages[drop])])
        total -= cost[drop]
        drop += 1
        # A message answering a dropped call goes with it: never half a tool pair.
        while drop < loaded and calls & _tool_call_ids([_db_as_prompt(messages[drop])]):
            total -= cost[drop]
            drop += 1
    return messages[drop:] if drop else None
