"""providers/_http.py on httpx.MockTransport: httpx errors -> APICallError, Retry-After, retries."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

from procmesh_orchestrator.config import ProviderConfig
from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.providers import AnthropicModel, OpenAIModel, ProviderConnection, _http
from procmesh_orchestrator.providers._http import RetryPolicy, error_from_payload, with_retries
from procmesh_orchestrator.run.models import ModelRequest

CONNECTION_RESET = re.compile(r"ECONNRESET|connection reset|socket hang up|connection (was )?closed", re.I)
REQUEST = ModelRequest(prompt=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
Handler = Callable[[httpx.Request], httpx.Response]


async def run(
    handler: Handler, *, kind: str = "openai", streaming: bool = True, **config: Any
) -> list[dict[str, Any]]:
    cfg = ProviderConfig.model_validate({"kind": kind, "baseUrl": "http://api.test/v1", **config})
    connection = ProviderConnection("p", cfg, transport=httpx.MockTransport(handler))
    model = (OpenAIModel if kind == "openai" else AnthropicModel)(connection, "m")
    req = ModelRequest(prompt=REQUEST.prompt, streaming=streaming)
    try:
        return [c async for c in model.stream(req)]
    finally:
        await connection.aclose()


async def failing(handler: Handler, **kw: Any) -> APICallError:
    with pytest.raises(APICallError) as info:
        await run(handler, **kw)
    return info.value


async def collect(stream: AsyncIterator[dict[str, Any]], into: list[dict[str, Any]]) -> None:
    async for chunk in stream:
        into.append(chunk)


def raiser(exc: Exception) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


class _BrokenStream(httpx.AsyncByteStream):
    """Two SSE events, then the peer resets the connection."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for word in ("one", " two"):
            event = {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
            yield f"data: {json.dumps(event)}\n\n".encode()
        raise httpx.ReadError("[Errno 104] Connection reset by peer")


@pytest.mark.parametrize(
    ("exc", "retryable", "needle"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), True, "connection reset or refused"),
        (httpx.ReadError("[Errno 104] Connection reset by peer"), True, "connection reset while talking"),
        (
            httpx.RemoteProtocolError("Server disconnected without sending a response."),
            True,
            "connection reset",
        ),
        (httpx.ReadTimeout("timed out"), True, "request timed out (ReadTimeout)"),
        (httpx.UnsupportedProtocol("Request URL has an unsupported protocol"), False, "unsupported URL"),
        (httpx.TooManyRedirects("Exceeded maximum allowed redirects."), False, "TooManyRedirects"),
    ],
)
async def test_transport_errors_are_status_0(exc: Exception, retryable: bool, needle: str) -> None:
    err = await failing(raiser(exc))
    assert (err.status, err.retryable, err.error_id) == (0, retryable, type(exc).__name__)
    assert needle in err.message
    assert "http://api.test/v1/chat/completions" in err.message
    assert isinstance(err.__cause__, httpx.HTTPError)
    if retryable and not isinstance(exc, httpx.TimeoutException):
        assert CONNECTION_RESET.search(err.message)


async def test_a_read_error_mid_stream_comes_after_the_chunks() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_BrokenStream())

    cfg = ProviderConfig(kind="openai", base_url="http://api.test/v1")
    connection = ProviderConnection("p", cfg, transport=httpx.MockTransport(handler))
    chunks: list[dict[str, Any]] = []
    with pytest.raises(APICallError) as info:
        await collect(OpenAIModel(connection, "m").stream(REQUEST), chunks)
    await connection.aclose()
    assert [c["payload"]["text"] for c in chunks] == ["one", " two"]
    assert (info.value.status, info.value.retryable) == (0, True)
    assert CONNECTION_RESET.search(info.value.message)


async def test_a_stream_cut_cleanly_before_its_end_is_a_closed_connection() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        event = {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
        body = f"data: {json.dumps(event)}\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=body)

    err = await failing(handler)
    assert (err.status, err.retryable, err.error_id) == (0, True, "STREAM_INCOMPLETE")
    assert CONNECTION_RESET.search(err.message)


async def test_a_json_answer_to_a_stream_request_is_not_retryable() -> None:
    err = await failing(lambda request: httpx.Response(200, json={"choices": []}))
    assert (err.status, err.retryable, err.error_id) == (0, False, "SSEError")
    assert "expected an event stream" in err.message


async def test_malformed_json_is_not_retryable() -> None:
    err = await failing(lambda request: httpx.Response(200, text="{nope"), streaming=False)
    assert (err.status, err.retryable, err.error_id) == (0, False, "MALFORMED")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3000.0),
        ({"retry-after": "0.5"}, 500.0),
        ({"retry-after-ms": "250", "retry-after": "9"}, 250.0),
        ({"retry-after": "soon"}, None),
    ],
)
async def test_retry_after(headers: dict[str, str], expected: float | None) -> None:
    err = await failing(
        lambda request: httpx.Response(429, headers=headers, json={"error": {"message": "slow"}})
    )
    assert err.details.get("retryAfterMs") == expected
    assert (err.status, err.retryable, err.message) == (429, True, "slow")


async def test_retry_after_as_an_http_date() -> None:
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    err = await failing(lambda request: httpx.Response(503, headers={"Retry-After": when}, text=""))
    assert 25_000 < err.details["retryAfterMs"] <= 30_000
    assert (err.status, err.retryable, err.message, err.body) == (503, True, "HTTP 503", "")


@pytest.mark.parametrize(
    ("payload", "status", "message", "retryable", "error_id"),
    [
        (
            {"error": {"message": "m", "type": "invalid_request_error", "code": "context_length_exceeded"}},
            400,
            "m",
            False,
            "context_length_exceeded",
        ),
        (
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            529,
            "Overloaded",
            True,
            "overloaded_error",
        ),
        (
            {"type": "error", "error": {"type": "rate_limit_error", "message": "r"}},
            429,
            "r",
            True,
            "rate_limit_error",
        ),
        (
            {"error": {"message": "v", "type": "BadRequestError", "code": 400}},
            400,
            "v",
            False,
            "BadRequestError",
        ),
        ({"object": "error", "message": "vllm says", "code": 400}, 500, "vllm says", True, ""),
        ({"error": "ollama says"}, 500, "ollama says", True, ""),
    ],
)
def test_error_payloads_inside_a_stream(
    payload: dict[str, Any], status: int, message: str, retryable: bool, error_id: str
) -> None:
    err = error_from_payload(payload, status=None, body=json.dumps(payload))
    assert (err.status, err.message, err.retryable, err.error_id) == (status, message, retryable, error_id)


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 529])
def test_retryable_statuses(status: int) -> None:
    assert error_from_payload(None, status=status, body="").retryable


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
def test_rejections_are_not_retryable(status: int) -> None:
    assert not error_from_payload(
        {"error": {"type": "invalid_request_error"}}, status=status, body=""
    ).retryable


def test_long_bodies_are_truncated() -> None:
    err = error_from_payload(None, status=500, body="x" * 50_000)
    assert len(err.body) == _http.MAX_BODY_CHARS


# -- provider-level retries ---------------------------------------------------------------


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(round(seconds * 1000))

    monkeypatch.setattr(_http.asyncio, "sleep", fake_sleep)
    return slept


def attempts(
    *outcomes: APICallError | list[str],
) -> tuple[Callable[[], AsyncGenerator[dict[str, Any], None]], list[int]]:
    """An attempt factory: each call raises its error or yields its texts (then maybe fails)."""
    started: list[int] = []

    async def attempt() -> AsyncGenerator[dict[str, Any], None]:
        outcome = outcomes[len(started)]
        started.append(1)
        if isinstance(outcome, APICallError):
            raise outcome
        for text in outcome:
            if text == "!":
                raise APICallError("connection reset", retryable=True)
            yield {"type": "text-delta", "payload": {"id": "t0", "text": text}}

    return attempt, started


async def drain(gen: AsyncGenerator[dict[str, Any], None]) -> list[str]:
    return [c["payload"]["text"] async for c in gen]


async def test_retries_back_off_exponentially_and_honour_retry_after(sleeps: list[float]) -> None:
    busy = APICallError("busy", status=503, retryable=True)
    slow = APICallError("slow", status=429, retryable=True, details={"retryAfterMs": 5000})
    attempt, started = attempts(busy, busy, slow, ["ok"])
    policy = RetryPolicy(max_retries=3, backoff_ms=100, jitter=lambda: 0.999999)
    assert await drain(with_retries(attempt, policy, what="m")) == ["ok"]
    assert len(started) == 4
    assert [round(s) for s in sleeps] == [100, 200, 5000]


def test_backoff_has_jitter_so_simultaneous_failures_do_not_retry_in_lockstep() -> None:
    busy = APICallError("busy", status=503, retryable=True)
    assert RetryPolicy(backoff_ms=100, jitter=lambda: 0.0).delay_ms(1, busy) == 100  # half of 200
    delays = [RetryPolicy(backoff_ms=100).delay_ms(1, busy) for _ in range(200)]
    assert all(100 <= d < 200 for d in delays)
    assert len(set(delays)) > 150
    slow = APICallError("slow", status=429, retryable=True, details={"retryAfterMs": 7000})
    assert RetryPolicy(backoff_ms=100, jitter=lambda: 0.0).delay_ms(0, slow) == 7000  # Retry-After is a floor


async def test_retries_are_off_by_default(sleeps: list[float]) -> None:
    attempt, started = attempts(APICallError("busy", status=503, retryable=True), ["ok"])
    with pytest.raises(APICallError):
        await drain(with_retries(attempt, RetryPolicy(), what="m"))
    assert (len(started), sleeps) == (1, [])


async def test_no_retry_for_rejections_or_after_a_chunk(sleeps: list[float]) -> None:
    attempt, started = attempts(APICallError("bad", status=400), ["ok"])
    with pytest.raises(APICallError, match="bad"):
        await drain(with_retries(attempt, RetryPolicy(max_retries=3), what="m"))
    assert len(started) == 1

    attempt, started = attempts(["a", "!"], ["ok"])
    chunks: list[dict[str, Any]] = []
    with pytest.raises(APICallError, match="connection reset"):
        await collect(with_retries(attempt, RetryPolicy(max_retries=3), what="m"), chunks)
    assert (len(chunks), len(started), sleeps) == (1, 1, [])


def test_backoff_is_capped() -> None:
    err = APICallError("slow", retryable=True, details={"retryAfterMs": 10**9})
    assert RetryPolicy(backoff_ms=500).delay_ms(0, err) == 60_000
