"""The four default error processors every agent gets (SPEC §5), written with the public SDK only.

In the default order: `provider-history-compat`, `prefill-error-handler`,
`unsupported-file-handler`, `stream-error-retry-processor`. Fixers come before
the blind retry, so a rejection a fixer can repair is not simply re-sent.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from procmesh import Processor

Message = dict[str, Any]
DEFAULT_ORDER = (
    "provider-history-compat",
    "prefill-error-handler",
    "unsupported-file-handler",
    "stream-error-retry-processor",
)

_ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_ANTHROPIC_ID_ERRORS = (
    re.compile(r"tool_use\.id.*should match pattern", re.IGNORECASE | re.DOTALL),
    re.compile(r"tool_call_id.*invalid", re.IGNORECASE | re.DOTALL),
    re.compile(r"tool_use_id.*should match pattern", re.IGNORECASE | re.DOTALL),
)
_PREFILL_ERRORS = (
    re.compile(r"does not support assistant message prefill", re.IGNORECASE),
    re.compile(r"assistant response prefill is incompatible with enable[_\s-]?thinking", re.IGNORECASE),
    re.compile(r"requests ending with a model turn are not supported", re.IGNORECASE),
)
_FILE_ERRORS = (
    re.compile(r"unsupported (file|mime|media|image|document|attachment)", re.IGNORECASE),
    re.compile(r"(file|mime|media|image|document) type .*not supported", re.IGNORECASE),
    re.compile(r"does not support (files|file inputs|images|image input|pdf|documents)", re.IGNORECASE),
    re.compile(
        r"(could not|unable to) (process|read|decode) (the )?(image|file|document|attachment)", re.IGNORECASE
    ),
    re.compile(r"invalid (image|file|document) (data|url|content)", re.IGNORECASE),
)
_CONNECTION_RESET = re.compile(
    r"ECONNRESET|connection reset|socket hang up|connection (was )?closed", re.IGNORECASE
)
_AUTH_STATUSES = {401, 403}


def _error_text(error: dict[str, Any]) -> str:
    return f"{error.get('message', '')}\n{error.get('body', '')}"


def _is_anthropic(model: str) -> bool:
    return model.startswith(("anthropic/", "anthropic:")) or "claude" in model.lower()


def rewrite_tool_ids(prompt: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Rewrite tool-call ids Anthropic rejects (``^[a-zA-Z0-9_-]+$``), calls and results alike.

    Returns the new prompt, or None when every id is already valid.
    """
    mapping: dict[str, str] = {}
    for msg in prompt:
        if isinstance(msg.get("content"), list):
            for part in msg["content"]:
                call_id = part.get("toolCallId")
                if call_id and not _ANTHROPIC_ID.match(call_id) and call_id not in mapping:
                    mapping[call_id] = re.sub(r"[^a-zA-Z0-9_-]", "_", call_id)
    if not mapping:
        return None
    out = []
    for msg in prompt:
        if isinstance(msg.get("content"), list):
            parts = [
                {**p, "toolCallId": mapping[p["toolCallId"]]} if p.get("toolCallId") in mapping else p
                for p in msg["content"]
            ]
            msg = {**msg, "content": parts}
        out.append(msg)
    return out


class ProviderHistoryCompat(Processor):
    """Rewrites provider-incompatible history in the outgoing prompt; recovers reactively.

    Anthropic tool-call ids that do not match ``^[a-zA-Z0-9_-]+$`` are rewritten
    pairwise (call and result keep matching) in the prompt only; the stored
    history keeps the original ids. When a provider the check did not recognise
    (e.g. Claude behind another gateway) rejects the ids, the rewrite is forced
    for the rest of the run and the call is retried once.
    """

    id = "provider-history-compat"
    description = "Fixes provider-specific history incompatibilities in the outgoing prompt."

    async def process_llm_request(
        self, prompt: list[dict[str, Any]], model: str, state: dict[str, Any]
    ) -> dict[str, Any] | None:
        if _is_anthropic(model) or state.get("forceToolIdRewrite"):
            rewritten = rewrite_tool_ids(prompt)
            if rewritten is not None:
                return {"prompt": rewritten}
        return None

    async def process_api_error(
        self, error: dict[str, Any], retry_count: int, state: dict[str, Any]
    ) -> dict[str, Any] | None:
        if retry_count > 0 or state.get("forceToolIdRewrite"):
            return None
        if any(p.search(_error_text(error)) for p in _ANTHROPIC_ID_ERRORS):
            state["forceToolIdRewrite"] = True
            return {"retry": True}
        return None


class PrefillErrorHandler(Processor):
    """Recovers from "assistant message prefill" rejections: asks the model to continue, retries once."""

    id = "prefill-error-handler"
    description = "Retries with a 'continue' reminder after an assistant-prefill rejection."

    async def process_api_error(
        self, error: dict[str, Any], retry_count: int, send_signal: Any
    ) -> dict[str, Any] | None:
        if retry_count > 0 or not any(p.search(_error_text(error)) for p in _PREFILL_ERRORS):
            return None
        await send_signal(
            {
                "type": "reactive",
                "tagName": "system-reminder",
                "contents": "continue",
                "attributes": {"type": "anthropic-prefill-processor-retry"},
                "metadata": {"message": "Continuing after prefill error"},
            }
        )
        return {"retry": True}


class UnsupportedFileHandler(Processor):
    """Removes the files a model rejects, leaving a placeholder, and calls the model again."""

    id = "unsupported-file-handler"
    description = "Drops attachments the model rejects (placeholder text) and retries."

    async def process_api_error(
        self, error: dict[str, Any], retry_count: int, message_list: Any
    ) -> dict[str, Any] | None:
        if retry_count > 0 or not any(p.search(_error_text(error)) for p in _FILE_ERRORS):
            return None
        removed = False
        for msg in message_list.get_all():
            parts = msg["content"].get("parts") or []
            if not any(p.get("type") in ("file", "image") for p in parts):
                continue
            new_parts = []
            for part in parts:
                if part.get("type") in ("file", "image"):
                    name = part.get("filename") or part.get("mediaType") or "file"
                    new_parts.append({"type": "text", "text": f"[Attachment unavailable: {name}]"})
                else:
                    new_parts.append(part)
            message_list.replace({**msg, "content": {**msg["content"], "parts": new_parts}})
            removed = True
        return {"retry": True} if removed else None


class StreamErrorRetryOptions(BaseModel):
    """Options of `stream-error-retry-processor`."""

    max_retries: int = Field(default=1, ge=0)
    """Retries this processor allows per step (it cannot raise the agent's cap)."""
    delay_ms: float = Field(default=0, ge=0)
    """Pause before a retry; a provider's Retry-After wins when longer (up to max_retry_after_ms)."""
    max_retry_after_ms: float = Field(default=30_000, ge=0)
    retry_unknown_errors: bool = False
    """Also retry errors nobody marked retryable (never authentication errors)."""


class StreamErrorRetryProcessor(Processor):
    """Retries transient failures: connection resets and errors the provider marks retryable."""

    id = "stream-error-retry-processor"
    description = "Retries transient provider and stream failures (max_retries, default 1)."
    Options = StreamErrorRetryOptions

    async def process_api_error(
        self, error: dict[str, Any], retry_count: int, options: StreamErrorRetryOptions
    ) -> dict[str, Any] | None:
        if retry_count >= options.max_retries:
            return None
        status = int(error.get("status") or 0)
        transient = bool(error.get("retryable")) or bool(_CONNECTION_RESET.search(_error_text(error)))
        if not transient and not (options.retry_unknown_errors and status not in _AUTH_STATUSES):
            return None
        retry_after_ms = float((error.get("details") or {}).get("retryAfterMs") or 0)
        delay = max(options.delay_ms, min(retry_after_ms, options.max_retry_after_ms))
        # The orchestrator waits (bounded by the run's deadline): a sleep here would count
        # against this hook's timeout, and a Retry-After longer than it failed the run.
        return {"retry": True, "delay_ms": delay}


def processors() -> list[Processor]:
    """The four defaults, in the default order."""
    return [
        ProviderHistoryCompat(),
        PrefillErrorHandler(),
        UnsupportedFileHandler(),
        StreamErrorRetryProcessor(),
    ]
