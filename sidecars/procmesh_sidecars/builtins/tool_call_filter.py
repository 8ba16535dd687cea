"""`tool-call-filter`: removes tool calls and their results from the prompt the model sees.

Works in ``processLLMRequest`` only, so the change is for one provider call: the
stored history (and what memory would persist) keeps every tool part. Calls and
results go as pairs; a message left empty is dropped. By default only tool calls
from earlier history are filtered, and the calls this run makes stay visible;
``filter_after_tool_steps`` filters during the run too, keeping the last N
tool-calling steps.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from procmesh import Processor
from procmesh_sidecars.builtins._common import PromptMessage, js_stringify, prompt_parts


class ToolCallFilterOptions(BaseModel):
    """Options of `tool-call-filter`."""

    exclude: list[str] | None = None
    """Tool names to filter; absent: every tool; ``[]``: nothing (no-op)."""
    filter_after_tool_steps: int | None = Field(default=None, ge=0)
    """Also filter this run's tool calls, except those of the last N assistant messages that made
    tool calls (0 keeps none). Absent: only history from before this run is filtered."""
    preserve_model_output: bool = False
    """Keep a compact ``"<tool> result:\\n<text>"`` for filtered results that carry an explicit
    model-facing output (``{"type": "text"|"json"|"content", "value": ...}``), never the raw
    arguments or raw results."""


_MODEL_OUTPUT_TYPES = ("text", "json", "content", "error-text", "error-json")


def model_output_text(output: Any) -> str | None:
    """The text of an explicit model-facing tool output, or None when the output has none."""
    if not isinstance(output, dict) or output.get("type") not in _MODEL_OUTPUT_TYPES or "value" not in output:
        return None
    kind, value = output["type"], output["value"]
    if kind in ("text", "error-text"):
        return value if isinstance(value, str) else None
    if kind in ("json", "error-json"):
        try:
            return js_stringify(value)
        except (TypeError, ValueError, RecursionError):
            return None
    if isinstance(value, list):  # content: text parts joined by newlines; media parts are left out
        texts = [str(p.get("text", "")) for p in value if isinstance(p, dict) and p.get("type") == "text"]
        return "\n".join(texts) if texts else None
    return None


class ToolCallFilter(Processor):
    """Filters tool calls and results out of the outgoing prompt (transiently)."""

    id = "tool-call-filter"
    name = "ToolCallFilter"
    description = "Removes tool calls and results from the prompt (this call only; history untouched)."
    Options = ToolCallFilterOptions

    async def process_llm_request(
        self, prompt: list[PromptMessage], options: ToolCallFilterOptions, state: dict[str, Any]
    ) -> dict[str, Any] | None:
        if "historyToolCallIds" not in state:  # the first prompt of the run: its tool calls are history
            state["historyToolCallIds"] = sorted(
                {
                    str(p["toolCallId"])
                    for m in prompt
                    for p in prompt_parts(m)
                    if p.get("type") in ("tool-call", "tool-result") and p.get("toolCallId")
                }
            )
        filtered = filter_prompt(prompt, options, set(state["historyToolCallIds"]))
        return None if filtered is None else {"prompt": filtered}


def _preserved_ids(
    prompt: list[PromptMessage], options: ToolCallFilterOptions, history: set[str]
) -> set[str]:
    calls = [
        [str(p.get("toolCallId")) for p in prompt_parts(m) if p.get("type") == "tool-call"]
        for m in prompt
        if m.get("role") == "assistant"
    ]
    calls = [ids for ids in calls if ids]
    if options.filter_after_tool_steps is None:
        return {i for ids in calls for i in ids if i not in history}
    n = options.filter_after_tool_steps
    return {i for ids in (calls[-n:] if n else []) for i in ids}


def filter_prompt(
    prompt: list[PromptMessage], options: ToolCallFilterOptions, history: set[str]
) -> list[PromptMessage] | None:
    """The filtered prompt, or None when nothing is filtered (the prompt goes out untouched)."""
    if options.exclude is not None and not options.exclude:
        return None
    preserved = _preserved_ids(prompt, options, history)

    def excluded_name(name: Any) -> bool:
        return options.exclude is None or name in options.exclude

    excluded: set[str] = set()
    names: dict[str, str] = {}
    for msg in prompt:
        if msg.get("role") not in ("assistant", "tool"):
            continue
        for part in prompt_parts(msg):
            if part.get("type") not in ("tool-call", "tool-result"):
                continue
            call_id = str(part.get("toolCallId"))
            names.setdefault(call_id, str(part.get("toolName", "")))
            if call_id not in preserved and excluded_name(part.get("toolName")):
                excluded.add(call_id)
    if not excluded:
        return None

    summaries: dict[str, str] = {}
    if options.preserve_model_output:
        for msg in prompt:
            for part in prompt_parts(msg):
                if part.get("type") == "tool-result" and str(part.get("toolCallId")) in excluded:
                    text = model_output_text(part.get("output"))
                    if text is not None:
                        call_id = str(part.get("toolCallId"))
                        summaries[call_id] = (
                            f"{part.get('toolName') or names.get(call_id, '')} result:\n{text}"
                        )

    out: list[PromptMessage] = []
    placed: set[str] = set()
    for msg in prompt:
        if msg.get("role") not in ("assistant", "tool") or isinstance(msg.get("content"), str):
            out.append(msg)
            continue
        parts: list[dict[str, Any]] = []
        orphan_summaries: list[dict[str, Any]] = []
        for part in msg.get("content") or []:
            call_id = str(part.get("toolCallId"))
            if part.get("type") in ("tool-call", "tool-result") and call_id in excluded:
                # A kept summary goes where the call was; a result whose call is not in the prompt
                # leaves its summary as assistant text where the result was.
                if call_id in summaries and call_id not in placed:
                    placed.add(call_id)
                    summary = {"type": "text", "text": summaries[call_id]}
                    (parts if msg.get("role") == "assistant" else orphan_summaries).append(summary)
                continue
            parts.append(part)
        if orphan_summaries:
            out.append({"role": "assistant", "content": orphan_summaries})
        if parts:
            out.append({**msg, "content": parts})
    return out
