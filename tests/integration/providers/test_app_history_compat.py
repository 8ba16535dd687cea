"""End to end: provider-history-compat's rules, built-in and your own, on the HTTP providers.

The App starts the built-in sidecar process (the default error processors) itself; the fake APIs
reject like the real ones and record what they receive, which is what the rules rewrite. Every
test also checks that the run's stored messages keep what the caller sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.errors import APICallError, ConfigError
from tests.integration.providers.conftest import ANTHROPIC_KEY_ENV, OPENAI_KEY_ENV
from tests.integration.providers.fakes import FakeAnthropic, FakeOpenAI, error
from tests.integration.providers.helpers import message, run_keeping_history, text

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.usefixtures("fresh_fakes")]

BAD_ID = "call:1/weather"  # valid for OpenAI, rejected by Anthropic's ^[a-zA-Z0-9_-]+$
REMINDER = '<system-reminder reason="max-steps-reached" step="5">Answer now.</system-reminder>'
YOUR_RULES = [
    {  # proactive, for one model
        "name": "house-ticket-ids",
        "model": "^local/strict$",
        "replace": [{"pattern": "ACME-[0-9]+", "replacement": "[ticket]"}],
    },
    {  # reactive, for any model: after a rejection naming the tag
        "name": "no-note-tags",
        "error_patterns": ["unsupported tag"],
        "replace": [{"pattern": "</?note>", "replacement": ""}],
    },
]


def openai(api: FakeOpenAI) -> dict[str, Any]:
    return {"kind": "openai", "baseUrl": api.base_url, "apiKeyEnv": OPENAI_KEY_ENV}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(openai_api: FakeOpenAI, anthropic_api: FakeAnthropic) -> AsyncIterator[App]:
    anthropic = {"kind": "anthropic", "baseUrl": anthropic_api.base_url, "apiKeyEnv": ANTHROPIC_KEY_ENV}
    compat = {"processor": "builtins/provider-history-compat", "options": {"additional_rules": YOUR_RULES}}
    config = parse_config(
        {
            "providers": {
                "anthropic": anthropic,
                "gateway": anthropic,  # Claude behind a gateway: its model id does not look like Claude
                "azure": openai(openai_api),
                "local": openai(openai_api),
            },
            "agents": {
                "claude": {"model": "anthropic/claude-test"},
                "gateway": {"model": "gateway/house-model"},
                "azure": {"model": "azure/azure-gpt"},
                "plain": {"model": "local/plain"},
                "strict": {"model": "local/strict", "errorProcessors": [compat]},
            },
        },
        "test config",
    )
    async with App(config) as app:
        yield app


def stored_texts(stored: list[Any]) -> list[str]:
    return [p["text"] for m in stored for p in m["content"]["parts"] if p["type"] == "text"]


def sent_user_texts(body: dict[str, Any]) -> list[str]:
    """The user turns' text the OpenAI-shaped body carries (a plain string or text parts)."""
    out = []
    for msg in body["messages"]:
        if msg["role"] == "user":
            content = msg["content"]
            out += [content] if isinstance(content, str) else [p["text"] for p in content if "text" in p]
    return out


# -- anthropic-tool-id-format ---------------------------------------------------------------------


def tool_history(call_id: str) -> list[dict[str, Any]]:
    """Stored history holding a finished tool call (e.g. made through another provider), then a question."""
    invocation = {
        "state": "result",
        "toolCallId": call_id,
        "toolName": "weather",
        "args": {"city": "Paris"},
        "result": {"celsius": 21},
    }
    return [
        message("user", text("Weather in Paris?")),
        message("assistant", text("Checking."), {"type": "tool-invocation", "toolInvocation": invocation}),
        message("user", text("And tomorrow?")),
    ]


def sent_tool_ids(body: dict[str, Any]) -> list[str]:
    return [
        block.get("id") or block.get("tool_use_id")
        for msg in body["messages"]
        for block in msg["content"]
        if block["type"] in ("tool_use", "tool_result")
    ]


async def test_history_compat_rewrites_ids_before_an_anthropic_model_sees_them(
    app: App, anthropic_api: FakeAnthropic
) -> None:
    anthropic_api.script("claude-test", {"text": "Rain tomorrow."})
    result, stored = await run_keeping_history(app, "claude", tool_history(BAD_ID))

    assert result.text == "Rain tomorrow."
    [call] = anthropic_api.calls("claude-test")  # proactive: never rejected
    assert sent_tool_ids(call.body) == ["call_1_weather", "call_1_weather"]
    assert stored[1]["content"]["parts"][1]["toolInvocation"]["toolCallId"] == BAD_ID


async def test_history_compat_recovers_reactively_behind_a_gateway(
    app: App, anthropic_api: FakeAnthropic
) -> None:
    anthropic_api.script("house-model", {"text": "Rain tomorrow."})
    result, stored = await run_keeping_history(app, "gateway", tool_history(BAD_ID))

    assert result.text == "Rain tomorrow."
    first, retry = anthropic_api.calls("house-model")  # rejected once, retried once
    assert sent_tool_ids(first.body) == [BAD_ID, BAD_ID]
    assert sent_tool_ids(retry.body) == ["call_1_weather", "call_1_weather"]
    assert stored[1]["content"]["parts"][1]["toolInvocation"]["toolCallId"] == BAD_ID


# -- azure-system-reminder-transform (SEED-GAPS D25) ----------------------------------------------


async def test_azure_reads_system_reminders_as_memory_context(app: App, openai_api: FakeOpenAI) -> None:
    history = [message("user", text("Find the report.")), message("user", text(REMINDER))]
    result, stored = await run_keeping_history(app, "azure", history)

    assert result.text == "ok"
    [call] = openai_api.calls("azure-gpt")
    assert sent_user_texts(call.body)[-1] == (
        '<memory-context reason="max-steps-reached" step="5">Answer now.</memory-context>'
    )
    assert stored_texts(stored)[:2] == ["Find the report.", REMINDER]  # stored as sent

    await run_keeping_history(app, "plain", history)  # another provider's model reads it as sent
    [call] = openai_api.calls("plain")
    assert sent_user_texts(call.body)[-1] == REMINDER


# -- additional_rules (SEED-GAPS D26) -------------------------------------------------------------


async def test_your_rule_rewrites_the_prompt_of_its_model(app: App, openai_api: FakeOpenAI) -> None:
    result, stored = await run_keeping_history(app, "strict", [message("user", text("Close ACME-1234."))])

    assert result.text == "ok"
    [call] = openai_api.calls("strict")  # proactive: never rejected
    assert sent_user_texts(call.body) == ["Close [ticket]."]
    assert stored_texts(stored)[0] == "Close ACME-1234."

    await app.agent("plain").generate("Close ACME-1234.")  # not its model: sent as written
    [call] = openai_api.calls("plain")
    assert sent_user_texts(call.body) == ["Close ACME-1234."]


async def test_your_reactive_rule_repairs_a_matching_rejection_once(app: App, openai_api: FakeOpenAI) -> None:
    openai_api.script("strict", error(400, "Invalid 'messages': unsupported tag <note>"), {"text": "Fixed."})
    result, stored = await run_keeping_history(app, "strict", [message("user", text("Hi <note>x</note>"))])

    assert result.text == "Fixed."
    first, retry = openai_api.calls("strict")
    assert sent_user_texts(first.body) == ["Hi <note>x</note>"]
    assert sent_user_texts(retry.body) == ["Hi x"]
    assert stored_texts(stored)[0] == "Hi <note>x</note>"


async def test_a_matching_rejection_the_rule_cannot_repair_is_not_retried(
    app: App, openai_api: FakeOpenAI
) -> None:
    openai_api.script("strict", error(400, "unsupported tag <note>"), {"text": "never"})
    with pytest.raises(APICallError, match="unsupported tag"):  # nothing of the rule's in the prompt
        await app.agent("strict").generate("Hi there")
    assert len(openai_api.calls("strict")) == 1


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        ({"name": "does-nothing", "model": "^local/"}, "additional_rules.0: {'name': 'does-nothing'"),
        ({"name": "azure-system-reminder-transform", "strip_reasoning": True}, "additional_rules.0.name"),
        ({"name": "typo", "strip_reasoning": True, "errorPatterns": ["x"]}, "'errorPatterns' was unexpected"),
    ],
)
async def test_a_bad_rule_is_refused_at_start_up(
    openai_api: FakeOpenAI, rule: dict[str, Any], named: str
) -> None:
    compat = {"processor": "builtins/provider-history-compat", "options": {"additional_rules": [rule]}}
    config = parse_config(
        {
            "providers": {"local": openai(openai_api)},
            "agents": {"a": {"model": "local/strict", "errorProcessors": [compat]}},
        },
        "test config",
    )
    with pytest.raises(ConfigError, match="provider-history-compat") as info:
        async with App(config):
            pass
    assert named in str(info.value), info.value
