"""End to end: `App` agents on the HTTP providers, each default error processor recovering its case
(provider-history-compat's rules: test_app_history_compat.py).

The App starts the built-in sidecar process (the default error processors)
itself; the fake APIs reject like the real ones, and count what they receive.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import APICallError, ConfigError
from procmesh_orchestrator.run import CallOptions, RunResult
from tests.integration.providers.conftest import ANTHROPIC_KEY_ENV, OPENAI_KEY_ENV
from tests.integration.providers.fakes import PREFILL_MESSAGE, FakeAnthropic, FakeOpenAI, error
from tests.integration.providers.helpers import message, run_keeping_history, text

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.usefixtures("fresh_fakes")]

PNG = "iVBORw0KGgoAAAANSUhEUg=="


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(openai_api: FakeOpenAI, anthropic_api: FakeAnthropic) -> AsyncIterator[App]:
    anthropic = {"kind": "anthropic", "baseUrl": anthropic_api.base_url, "apiKeyEnv": ANTHROPIC_KEY_ENV}
    config = parse_config(
        {
            "providers": {
                "anthropic": anthropic,
                "local": {"kind": "openai", "baseUrl": openai_api.base_url, "apiKeyEnv": OPENAI_KEY_ENV},
            },
            "agents": {
                "claude": {"model": "anthropic/claude-test"},
                "text-only": {"model": "local/text-only"},
                "flaky": {"model": "local/flaky"},
                "broad": {  # your own instance with broader matchers: any 400, an "overloaded" code
                    "model": "local/flaky",
                    "maxProcessorRetries": 5,
                    "errorProcessors": [
                        {
                            "processor": "builtins/stream-error-retry-processor",
                            "options": {
                                "matchers": [
                                    {"status": [400], "max_retries": 2},
                                    {"code": ["quota_paused"], "max_retries": 1},
                                ]
                            },
                        }
                    ],
                },
            },
        },
        "test config",
    )
    async with App(config) as app:
        yield app


# -- prefill-error-handler --------------------------------------------------------------------------


async def test_prefill_rejection_is_retried_with_a_continue_reminder(
    app: App, anthropic_api: FakeAnthropic
) -> None:
    anthropic_api.script("claude-test", {"text": " leaves fall slowly."})
    result = await app.agent("claude").generate(
        [message("user", text("Write a haiku.")), message("assistant", text("Autumn"))]
    )

    assert result.text == " leaves fall slowly."
    first, retry = anthropic_api.calls("claude-test")
    assert first.body["messages"][-1]["role"] == "assistant"
    assert retry.body["messages"][-1] == {
        "role": "user",
        "content": [
            text('<system-reminder type="anthropic-prefill-processor-retry">continue</system-reminder>')
        ],
    }
    assert retry.body["messages"][:-1] == first.body["messages"]  # the earlier prompt stays a prefix
    assert PREFILL_MESSAGE not in str(result.error)


# -- unsupported-file-handler -----------------------------------------------------------------------


async def test_rejected_image_is_replaced_by_a_placeholder(app: App, openai_api: FakeOpenAI) -> None:
    openai_api.text_only.add("text-only")
    openai_api.script("text-only", {"text": "I cannot see it, but go on."})
    picture = {"type": "file", "mediaType": "image/png", "data": PNG}
    question = message("user", text("What is in this picture?"), picture)
    result, stored = await run_keeping_history(app, "text-only", [question])

    assert result.text == "I cannot see it, but go on."
    first, retry = openai_api.calls("text-only")
    assert first.body["messages"][-1]["content"][1]["type"] == "image_url"
    assert retry.body["messages"][-1]["content"] == [
        text("What is in this picture?"),
        text("[Attachment unavailable: image/png]"),
    ]
    assert stored[0]["content"] == question["content"]  # the thread keeps the attachment


async def test_the_placeholder_names_the_file_when_the_caller_did(app: App, openai_api: FakeOpenAI) -> None:
    openai_api.text_only.add("text-only")
    picture = {"type": "file", "mediaType": "image/png", "data": PNG, "filename": "cat.png"}
    await app.agent("text-only").generate([message("user", text("What is in this picture?"), picture)])

    _, retry = openai_api.calls("text-only")  # the name crossed to the sidecar with the prompt
    assert retry.body["messages"][-1]["content"][1] == text("[Attachment unavailable: cat.png]")


# -- stream-error-retry-processor -------------------------------------------------------------------


async def stream(app: App, agent_id: str) -> tuple[list[dict[str, Any]], RunResult]:
    run = app.agent(agent_id).stream("Tell me something.")
    chunks = [chunk async for chunk in run]
    return chunks, await run.result()


async def test_a_500_is_retried_once(app: App, openai_api: FakeOpenAI) -> None:
    openai_api.script("flaky", error(500, "The server had an error", "server_error"), {"text": "recovered"})
    chunks, result = await stream(app, "flaky")

    assert (result.text, result.finish_reason, result.error) == ("recovered", "stop", None)
    assert len(openai_api.calls("flaky")) == 2
    assert chunks[-1]["type"] == "finish"


async def test_a_retry_after_longer_than_the_hook_timeout_is_waited_by_the_orchestrator(
    app: App, openai_api: FakeOpenAI
) -> None:
    # The error processor's hook timeout is 5 s. It used to sleep for Retry-After inside its hook,
    # so a 5.5 s Retry-After failed the run; now it returns the delay and the orchestrator waits.
    busy = {**error(429, "Rate limit reached", "requests"), "headers": {"retry-after-ms": "5500"}}
    openai_api.script("flaky", busy, {"text": "recovered"})
    started = time.monotonic()
    _, result = await stream(app, "flaky")
    assert (result.text, result.error) == ("recovered", None)
    assert len(openai_api.calls("flaky")) == 2
    assert time.monotonic() - started >= 5.5  # the Retry-After was honoured, not skipped


async def test_a_retry_after_past_the_run_deadline_is_not_waited_for(
    app: App, openai_api: FakeOpenAI
) -> None:
    busy = {**error(429, "Rate limit reached", "requests"), "headers": {"retry-after-ms": "20000"}}
    openai_api.script("flaky", busy, {"text": "recovered"})
    # A run that slept into its deadline would end with the deadline's error, not the provider's
    # (no clock is asserted: the error says which).
    with pytest.raises(APICallError, match="Rate limit"):
        await app.agent("flaky").generate("hi", CallOptions(timeout=3))
    assert len(openai_api.calls("flaky")) == 1


async def test_a_reset_mid_stream_is_retried_once(app: App, openai_api: FakeOpenAI) -> None:
    openai_api.script("flaky", {"text": "one two three four", "resetAfter": 3}, {"text": "recovered"})
    chunks, result = await stream(app, "flaky")

    deltas = [c["payload"]["text"] for c in chunks if c["type"] == "text-delta"]
    assert deltas == ["one", " two", "recovered"]  # streamed chunks are not retracted
    assert (result.text, result.error) == ("recovered", None)
    assert len(openai_api.calls("flaky")) == 2


async def test_an_overloaded_anthropic_stream_is_retried_once(app: App, anthropic_api: FakeAnthropic) -> None:
    overloaded = {"text": "a b", "streamError": {"type": "overloaded_error", "message": "Overloaded"}}
    anthropic_api.script("claude-test", overloaded, {"text": "recovered"})
    _, result = await stream(app, "claude")

    assert (result.text, result.error) == ("recovered", None)
    assert len(anthropic_api.calls("claude-test")) == 2


async def test_a_transient_failure_is_retried_only_once(app: App, openai_api: FakeOpenAI) -> None:
    openai_api.script("flaky", error(503, "busy", "server_error"))
    _, result = await stream(app, "flaky")

    assert (result.finish_reason, result.error) == ("error", "busy")
    assert len(openai_api.calls("flaky")) == 2


async def test_a_401_is_not_retried(app: App, openai_api: FakeOpenAI) -> None:
    openai_api.script("flaky", error(401, "Incorrect API key provided.", code="invalid_api_key"))
    with pytest.raises(APICallError) as info:
        await app.agent("flaky").generate("hi")

    assert (info.value.status, info.value.retryable) == (401, False)
    assert len(openai_api.calls("flaky")) == 1


async def test_the_default_instance_does_not_retry_a_bad_request(app: App, openai_api: FakeOpenAI) -> None:
    openai_api.script("flaky", error(400, "Invalid 'messages'"), {"text": "never"})
    with pytest.raises(APICallError, match="Invalid 'messages'"):
        await app.agent("flaky").generate("hi")
    assert len(openai_api.calls("flaky")) == 1


async def test_a_transient_openai_stream_code_is_retried_by_the_built_in_matcher(
    app: App, openai_api: FakeOpenAI
) -> None:
    # Not marked retryable by the provider layer (a 400), but its code says it is passing.
    openai_api.script("flaky", error(400, "Please slow down", "rate_limit_exceeded"), {"text": "recovered"})
    _, result = await stream(app, "flaky")
    assert (result.text, result.error) == ("recovered", None)
    assert len(openai_api.calls("flaky")) == 2


async def test_your_own_instance_retries_what_its_matchers_match(app: App, openai_api: FakeOpenAI) -> None:
    bad = error(400, "Invalid 'messages'")
    openai_api.script("flaky", bad, bad, {"text": "third time"})
    _, result = await stream(app, "broad")
    assert (result.text, result.error) == ("third time", None)  # the 400 matcher allows two retries
    assert len(openai_api.calls("flaky")) == 3

    openai_api.reset()
    paused = error(409, "Quota paused", "quota_paused")
    openai_api.script("flaky", paused, paused, {"text": "never"})
    with pytest.raises(APICallError, match="Quota paused"):  # its matcher allows one retry
        await app.agent("broad").generate("hi")
    assert len(openai_api.calls("flaky")) == 2


async def test_a_matcher_without_a_criterion_is_refused_at_start_up(openai_api: FakeOpenAI) -> None:
    config = parse_config(
        {
            "providers": {
                "local": {"kind": "openai", "baseUrl": openai_api.base_url, "apiKeyEnv": OPENAI_KEY_ENV}
            },
            "agents": {
                "a": {
                    "model": "local/flaky",
                    "errorProcessors": [
                        {"processor": "builtins/stream-error-retry-processor", "options": {"matchers": [{}]}}
                    ],
                }
            },
        },
        "test config",
    )
    with pytest.raises(ConfigError, match="stream-error-retry-processor"):
        async with App(config):
            pass
