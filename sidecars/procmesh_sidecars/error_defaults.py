"""The four default error processors every agent gets (SPEC §5), written with the public SDK only.

`provider-history-compat` and its rules have their own module (history_compat.py).

In the default order: `provider-history-compat`, `prefill-error-handler`,
`unsupported-file-handler`, `stream-error-retry-processor`. Fixers come before
the blind retry, so a rejection a fixer can repair is not simply re-sent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from procmesh import Processor
from procmesh_sidecars.history_compat import ProviderHistoryCompat

Message = dict[str, Any]
DEFAULT_ORDER = (
    "provider-history-compat",
    "prefill-error-handler",
    "unsupported-file-handler",
    "stream-error-retry-processor",
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
    """Removes the files a model rejects from the prompt, leaving a placeholder, and calls the
    model again; the stored history keeps the attachments."""

    id = "unsupported-file-handler"
    description = "Drops attachments the model rejects from the prompt (placeholder text) and retries."

    async def process_llm_request(
        self, prompt: list[dict[str, Any]], state: dict[str, Any]
    ) -> dict[str, Any] | None:
        if not state.get(_DROP_FILES):
            state[_PROMPT_HAS_FILES] = any(_file_parts(msg) for msg in prompt)
            return None
        out = [
            {**msg, "content": [_placeholder(p) if p.get("type") == "file" else p for p in msg["content"]]}
            if _file_parts(msg)
            else msg
            for msg in prompt
        ]
        return {"prompt": out}

    async def process_api_error(
        self, error: dict[str, Any], retry_count: int, state: dict[str, Any]
    ) -> dict[str, Any] | None:
        if retry_count > 0 or not any(p.search(_error_text(error)) for p in _FILE_ERRORS):
            return None
        if state.get(_DROP_FILES) or not state.get(_PROMPT_HAS_FILES):
            return None  # nothing left to remove: the retry would be rejected the same way
        # For the rest of the run: every later step would send the same files.
        state[_DROP_FILES] = True
        return {"retry": True}


_DROP_FILES = "dropFiles"
_PROMPT_HAS_FILES = "promptHasFiles"


def _file_parts(msg: dict[str, Any]) -> bool:
    content = msg.get("content")
    return isinstance(content, list) and any(p.get("type") == "file" for p in content)


def _placeholder(part: dict[str, Any]) -> dict[str, Any]:
    # The file's name when the caller gave one, else its media type (what every file part has).
    name = part.get("filename") or part.get("mediaType") or "file"
    return {"type": "text", "text": f"[Attachment unavailable: {name}]"}


_RETRYABLE_STREAM_CODES = (
    "rate_limit",
    "server_error",
    "internal_error",
    "timeout",
    "temporarily_unavailable",
    "service_unavailable",
    "overloaded",
)
_RETRY_HINT = re.compile(r"you can retry your request", re.IGNORECASE)
_AUTH_CODES = {"access_denied", "authentication_error", "forbidden", "invalid_api_key", "permission_denied"}


def _body_errors(error: dict[str, Any]) -> list[dict[str, Any]]:
    """The error objects a provider's body holds: ``{error}``, a stream's ``{type: "error", error}``
    and an OpenAI Responses ``{type: "response.failed", response: {error}}``."""
    try:
        body = json.loads(error.get("body") or "")
    except ValueError:
        return []
    if not isinstance(body, dict):
        return []
    found = [
        body.get("error"),
        (body.get("response") or {}).get("error") if isinstance(body.get("response"), dict) else None,
    ]
    return [e for e in found if isinstance(e, dict)]


def _codes(error: dict[str, Any]) -> set[str]:
    """Every code and type the error carries (its details and its body's error objects), lowercased."""
    codes = set()
    for source in (error.get("details") or {}, *_body_errors(error)):
        for key in ("code", "type"):
            value = source.get(key)
            if isinstance(value, str) and value:
                codes.add(value.lower())
    return codes


def _retryable_stream_error(error: dict[str, Any]) -> bool:
    """The reference's built-in matcher: an OpenAI stream error whose code or type says it is
    passing (rate limit, server error, overload, timeout...), or whose message invites a retry."""
    if any(marker in code for code in _codes(error) for marker in _RETRYABLE_STREAM_CODES):
        return True
    return any(_RETRY_HINT.search(str(e.get("message", ""))) for e in _body_errors(error))


def _auth_error(error: dict[str, Any]) -> bool:
    return int(error.get("status") or 0) in _AUTH_STATUSES or bool(_codes(error) & _AUTH_CODES)


_ANY_CRITERION: list[JsonValue] = [
    {"required": ["status"], "properties": {"status": {"minItems": 1}}},
    {"required": ["code"], "properties": {"code": {"minItems": 1}}},
    {"required": ["error_id"], "properties": {"error_id": {"minItems": 1}}},
    {"required": ["message"], "properties": {"message": {"type": "string"}}},
]
"""A matcher's published schema asks for one criterion, so the orchestrator refuses an empty one."""


class RetryMatcher(BaseModel):
    """One of your own instance's matchers: the seeds' ``matchers`` entries as data (a function
    cannot cross to a sidecar). An error matches when every criterion given holds; the first
    matching matcher's policy decides."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"anyOf": _ANY_CRITERION})

    status: list[int] = []
    """HTTP statuses that match (``[400]``: the reference's bad-request matcher)."""
    code: list[str] = []
    """Provider error codes or types that match, as substrings (``overloaded``), case-insensitive."""
    error_id: list[str] = []
    """Error ids that match (``DOWNLOAD_ASSETS_FAILED``)."""
    message: str | None = None
    """A regular expression searched in the message and the body, case-insensitive."""
    max_retries: int | None = Field(default=None, ge=0)
    """This matcher's own retry cap (default: the processor's ``max_retries``)."""
    delay_ms: float | None = Field(default=None, ge=0)
    """This matcher's pause before a retry (default: the processor's ``delay_ms``)."""
    backoff: bool = False
    """Double the pause with each retry (``delay_ms * 2**retry_count``), up to ``max_retry_after_ms``."""

    @model_validator(mode="after")
    def _some_criterion(self) -> RetryMatcher:
        if not (self.status or self.code or self.error_id or self.message):
            raise ValueError(
                "a matcher needs at least one of status, code, error_id, message (else it matches all)"
            )
        if self.message is not None:
            try:
                re.compile(self.message)
            except re.error as exc:
                raise ValueError(f"message is not a regular expression: {exc}") from None
        return self

    def matches(self, error: dict[str, Any]) -> bool:
        """Every criterion given holds for `error`."""
        if self.status and int(error.get("status") or 0) not in self.status:
            return False
        if self.code and not any(c.lower() in code for c in self.code for code in _codes(error)):
            return False
        if self.error_id and str(error.get("id") or "") not in self.error_id:
            return False
        return self.message is None or bool(re.search(self.message, _error_text(error), re.IGNORECASE))


class StreamErrorRetryOptions(BaseModel):
    """Options of `stream-error-retry-processor`."""

    max_retries: int = Field(default=1, ge=0)
    """Retries this processor allows per step (it cannot raise the agent's cap)."""
    delay_ms: float = Field(default=0, ge=0)
    """Pause before a retry; a provider's Retry-After wins when longer (up to max_retry_after_ms)."""
    max_retry_after_ms: float = Field(default=30_000, ge=0)
    matchers: list[RetryMatcher] = []
    """Your own matchers, after the built-in one (transient OpenAI stream errors): the first that
    matches gives the policy; then errors the provider marks retryable and connection resets."""
    retry_unknown_errors: bool = False
    """Also retry errors nothing matched (never authentication errors: 401, 403, or an
    ``invalid_api_key``-like code)."""


@dataclass(frozen=True)
class _Policy:
    max_retries: int | None = None
    delay_ms: float | None = None
    backoff: bool = False


class StreamErrorRetryProcessor(Processor):
    """Retries transient failures: connection resets, transient OpenAI stream errors and errors the
    provider marks retryable; your own instance's `matchers` may retry more (any 400, a code)."""

    id = "stream-error-retry-processor"
    description = "Retries transient provider and stream failures (max_retries, default 1; matchers)."
    Options = StreamErrorRetryOptions

    async def process_api_error(
        self, error: dict[str, Any], retry_count: int, options: StreamErrorRetryOptions
    ) -> dict[str, Any] | None:
        policy = _policy(error, options)
        if policy is None:
            return None
        cap = options.max_retries if policy.max_retries is None else policy.max_retries
        if retry_count >= cap:
            return None
        delay = options.delay_ms if policy.delay_ms is None else policy.delay_ms
        if policy.backoff:
            delay = min(delay * 2**retry_count, options.max_retry_after_ms)
        retry_after_ms = float((error.get("details") or {}).get("retryAfterMs") or 0)
        delay = max(delay, min(retry_after_ms, options.max_retry_after_ms))
        # The orchestrator waits (bounded by the run's deadline): a sleep here would count
        # against this hook's timeout, and a Retry-After longer than it failed the run.
        return {"retry": True, "delay_ms": delay}


def _policy(error: dict[str, Any], options: StreamErrorRetryOptions) -> _Policy | None:
    """The reference's order: the built-in matcher, yours, the provider's mark (and connection
    resets), then ``retry_unknown_errors`` for anything but an authentication error."""
    if _retryable_stream_error(error):
        return _Policy()
    for matcher in options.matchers:
        if matcher.matches(error):
            return _Policy(matcher.max_retries, matcher.delay_ms, matcher.backoff)
    if error.get("retryable") or _CONNECTION_RESET.search(_error_text(error)):
        return _Policy()
    if options.retry_unknown_errors and not _auth_error(error):
        return _Policy()
    return None


def processors() -> list[Processor]:
    """The four defaults, in the default order."""
    return [
        ProviderHistoryCompat(),
        PrefillErrorHandler(),
        UnsupportedFileHandler(),
        StreamErrorRetryProcessor(),
    ]
