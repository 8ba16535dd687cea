"""HTTP for the providers: the shared client factory and the ONE place httpx errors become `APICallError`.

Everything a provider sends goes through `post_json` (generate) or `post_sse`
(stream); both raise only `APICallError`. `with_retries` adds the optional
provider-level retries (off by default: the error processors decide).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, SSEError, aconnect_sse

from procmesh_orchestrator.errors import APICallError

log = logging.getLogger(__name__)

Chunk = dict[str, Any]

MAX_BODY_CHARS = 20_000
"""Error bodies are kept up to this many characters (processors match on them)."""

_RETRYABLE_STATUSES = frozenset({408, 409, 429})
_RETRYABLE_ERROR_TYPES = frozenset({"overloaded_error"})
_STATUS_BY_ERROR_TYPE: dict[str, int] = {
    # Anthropic error types (also sent as SSE `error` events, which carry no HTTP status) ...
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
    # ... and OpenAI-compatible ones.
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "server_error": 500,
}

# httpx failures without an HTTP status, first match wins (subclasses before their bases).
# Resets and read errors say "connection reset": the stream-error-retry processor matches on it.
_TRANSPORT_ERRORS: tuple[tuple[type[httpx.HTTPError], str, bool], ...] = (
    (SSEError, "{url}: expected an event stream ({detail})", False),
    (httpx.UnsupportedProtocol, "{url}: unsupported URL ({detail})", False),
    (httpx.TimeoutException, "{url}: request timed out ({kind})", True),
    (httpx.ConnectError, "cannot connect to {url}: connection reset or refused ({detail})", True),
    (httpx.TransportError, "connection reset while talking to {url} ({kind}: {detail})", True),
    (httpx.HTTPError, "{url}: {kind}: {detail}", False),
)


def make_client(timeout: float, *, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The providers' `httpx.AsyncClient`: `timeout` to connect and between bytes, pooled connections.

    Writing and waiting for a pool slot get shorter limits; there is no overall
    deadline (a long answer may stream for minutes; the run's timeout bounds it).
    """
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0), write=min(timeout, 30.0)),
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=16, keepalive_expiry=30.0),
        transport=transport,
        follow_redirects=False,
    )


def error_from_payload(
    payload: Any, *, status: int | None, body: str, headers: Mapping[str, str] | None = None
) -> APICallError:
    """An `APICallError` from a provider's error JSON (an HTTP error body or an SSE error event).

    Understands ``{"error": {"message", "type", "code"}}`` (OpenAI, Anthropic),
    ``{"error": "text"}`` (Ollama), ``{"message": ...}`` (vLLM) and FastAPI's
    ``{"detail": ...}``. Without an HTTP `status` (an error inside a stream) the
    status comes from the error's code or type.
    """
    err: dict[str, Any] = {}
    message = ""
    if isinstance(payload, dict):
        raw = payload.get("error")
        if isinstance(raw, dict):
            err = raw
        elif isinstance(raw, str):
            message = raw
        message = message or str(err.get("message") or payload.get("message") or "")
        if not message and payload.get("detail") is not None:
            detail = payload["detail"]
            message = detail if isinstance(detail, str) else json.dumps(detail, separators=(",", ":"))
    error_type = str(err.get("type") or "")
    code = err.get("code")
    if status is None:
        status = _status_of(code, error_type)
    message = message or (body.strip()[:500] if body.strip() else f"HTTP {status}")
    details: dict[str, Any] = {}
    if headers is not None:
        retry_after = _retry_after_ms(headers)
        if retry_after is not None:
            details["retryAfterMs"] = retry_after
        request_id = headers.get("request-id") or headers.get("x-request-id")
        if request_id:
            details["requestId"] = request_id
    return APICallError(
        message,
        status=status,
        body=body[:MAX_BODY_CHARS],
        retryable=_is_retryable(status, error_type),
        error_id=str(code) if isinstance(code, str) and code else error_type,
        details=details,
    )


def _status_of(code: Any, error_type: str) -> int:
    with contextlib.suppress(TypeError, ValueError):
        if 400 <= int(code) <= 599:
            return int(code)
    return _STATUS_BY_ERROR_TYPE.get(error_type, 500)


def _is_retryable(status: int, error_type: str) -> bool:
    return status in _RETRYABLE_STATUSES or status >= 500 or error_type in _RETRYABLE_ERROR_TYPES


def _retry_after_ms(headers: Mapping[str, str]) -> float | None:
    """``retry-after-ms`` (OpenAI) or ``Retry-After`` in seconds or as an HTTP date."""
    with contextlib.suppress(ValueError):
        if "retry-after-ms" in headers:
            return max(0.0, float(headers["retry-after-ms"]))
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value) * 1000)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when.timestamp() - time.time()) * 1000)


def error_from_response(response: httpx.Response) -> APICallError:
    """An `APICallError` for an HTTP status >= 400 (the body must have been read)."""
    body = response.text
    try:
        payload: Any = json.loads(body) if body.strip() else None
    except ValueError:
        payload = None
    return error_from_payload(payload, status=response.status_code, body=body, headers=response.headers)


def _transport_error(exc: httpx.HTTPError, url: str) -> APICallError:
    for cls, template, retryable in _TRANSPORT_ERRORS:
        if isinstance(exc, cls):
            message = template.format(url=url, kind=type(exc).__name__, detail=str(exc) or "no detail")
            return APICallError(message, status=0, retryable=retryable, error_id=type(exc).__name__)
    raise AssertionError("httpx.HTTPError is the table's last row")  # pragma: no cover


@contextlib.asynccontextmanager
async def _translated(url: str) -> AsyncIterator[None]:
    try:
        yield
    except httpx.HTTPError as exc:
        raise _transport_error(exc, url) from exc


def parse_json(text: str, what: str) -> Any:
    """JSON from the provider; a malformed document is a non-retryable `APICallError`."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise APICallError(
            f"malformed JSON in {what}: {exc}", status=0, body=text[:MAX_BODY_CHARS], error_id="MALFORMED"
        ) from None


async def post_json(
    client: httpx.AsyncClient, url: str, *, headers: Mapping[str, str], body: dict[str, Any]
) -> Any:
    """POST `body`, return the JSON answer; every failure is an `APICallError`."""
    async with _translated(url):
        response = await client.post(url, json=body, headers=dict(headers))
        if response.status_code >= 400:
            raise error_from_response(response)
        return parse_json(response.text, f"the response of {url}")


async def post_sse(
    client: httpx.AsyncClient, url: str, *, headers: Mapping[str, str], body: dict[str, Any]
) -> AsyncGenerator[ServerSentEvent, None]:
    """POST `body` and yield its server-sent events (parsed by httpx-sse); failures are `APICallError`."""
    async with (
        _translated(url),
        aconnect_sse(client, "POST", url, json=body, headers=dict(headers)) as source,
    ):
        if source.response.status_code >= 400:
            await source.response.aread()
            raise error_from_response(source.response)
        async for event in source.aiter_sse():
            yield event


@dataclass(frozen=True)
class RetryPolicy:
    """Provider-level retries of retryable failures that happen before the first chunk."""

    max_retries: int = 0
    backoff_ms: float = 500.0
    max_delay_ms: float = 60_000.0
    jitter: Callable[[], float] = field(default=random.random, compare=False)
    """A number in [0, 1) per delay: runs that failed together (one 429 for all) retry spread out
    instead of in lockstep."""

    def delay_ms(self, attempt: int, error: APICallError) -> float:
        """Exponential backoff from `backoff_ms` with equal jitter (half fixed, half random); the
        provider's Retry-After is a floor and wins when longer."""
        nominal = self.backoff_ms * 2.0**attempt
        jittered = nominal * (0.5 + 0.5 * self.jitter())
        retry_after = float(error.details.get("retryAfterMs") or 0)
        return min(max(jittered, retry_after), self.max_delay_ms)


async def with_retries(
    attempt: Callable[[], AsyncGenerator[Chunk, None]], policy: RetryPolicy, *, what: str
) -> AsyncGenerator[Chunk, None]:
    """Yield `attempt()`'s chunks, starting it again on a retryable error before any chunk was yielded.

    Once a chunk is out, an error propagates: the caller has seen part of the
    answer and only the agent loop (its error processors) may replay the step.
    """
    retries = 0
    while True:
        started = False
        try:
            async with contextlib.aclosing(attempt()) as chunks:
                async for chunk in chunks:
                    started = True
                    yield chunk
            return
        except APICallError as err:
            if started or not err.retryable or retries >= policy.max_retries:
                raise
            delay = policy.delay_ms(retries, err)
            retries += 1
            log.warning(
                "%s: %s; retry %d/%d in %.0f ms", what, err.message, retries, policy.max_retries, delay
            )
            await asyncio.sleep(delay / 1000)
