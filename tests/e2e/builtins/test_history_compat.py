"""provider-history-compat's reasoning rules through a real `procmesh-sidecar error-defaults` process.

The HTTP providers send back at most their own signed reasoning, so these run on scripted models
named like the providers' models: the scripted model records the prompt exactly as the error lane
left it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.builtins.harness import SIDECAR, start

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

MODELS = ("cerebras/zai-glm-4.7", "anthropic/claude-sonnet-4-5", "openai/gpt-5", "house/reasoner")
YOUR_RULE = {"name": "house-no-reasoning", "model": "^house/", "strip_reasoning": True}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "error-defaults")


def config(address: str) -> Config:
    compat = {"processor": f"{SIDECAR}/provider-history-compat", "options": {"additional_rules": [YOUR_RULE]}}
    agent = {"errorProcessorDefaults": False, "errorProcessors": [compat]}
    return parse_config(
        {
            "sidecars": {SIDECAR: {"address": address, "timeout": 10}},
            "models": {m: {"provider": "scripted", "responses": [{"text": "ok"}]} for m in MODELS},
            "agents": {m.replace("/", "-"): {**agent, "model": m} for m in MODELS},
        },
        "test config",
    )


def history() -> list[dict[str, Any]]:
    """A conversation whose earlier answer came with reasoning (another provider's), then a question."""

    def message(role: str, *parts: dict[str, Any]) -> dict[str, Any]:
        return {"role": role, "content": {"format": 2, "parts": list(parts)}}

    return [
        message("user", {"type": "text", "text": "Plan the trip."}),
        message(
            "assistant",
            {"type": "reasoning", "text": "Trains are faster."},
            {"type": "text", "text": "By train."},
        ),
        message("assistant", {"type": "reasoning", "text": "Only thinking."}),
        message("user", {"type": "text", "text": "And back?"}),
    ]


async def sent_prompt(
    app: App, model: str, conversation: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    await app.agent(model.replace("/", "-")).generate(conversation or history())
    scripted = app.models[model]
    assert isinstance(scripted, ScriptedModel)
    return scripted.requests[-1].prompt


def part_types(prompt: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    return [(m["role"], [p["type"] for p in m["content"]]) for m in prompt if m["role"] != "system"]


@pytest.mark.parametrize("model", ["cerebras/zai-glm-4.7", "anthropic/claude-sonnet-4-5", "house/reasoner"])
async def test_reasoning_is_stripped_for_the_models_that_refuse_it(address: str, model: str) -> None:
    async with App(config(address)) as app:
        prompt = await sent_prompt(app, model)
    # The turn of reasoning only is dropped (a provider refuses an empty assistant turn).
    assert part_types(prompt) == [("user", ["text"]), ("assistant", ["text"]), ("user", ["text"])]


async def test_other_models_get_the_reasoning(address: str) -> None:
    async with App(config(address)) as app:
        prompt = await sent_prompt(app, "openai/gpt-5")
    assert part_types(prompt) == [
        ("user", ["text"]),
        ("assistant", ["reasoning", "text"]),
        ("assistant", ["reasoning"]),
        ("user", ["text"]),
    ]


def history_with_provenance() -> list[dict[str, Any]]:
    """An Anthropic turn (its signed thinking, its server-side web search) and an OpenAI turn (its
    encrypted reasoning), as the reference stores them (``providerMetadata``), then a question."""

    def message(role: str, *parts: dict[str, Any]) -> dict[str, Any]:
        return {"role": role, "content": {"format": 2, "parts": list(parts)}}

    search = {
        "type": "tool-invocation",
        "providerExecuted": True,
        "providerMetadata": {"anthropic": {}},
        "toolInvocation": {
            "state": "result",
            "toolCallId": "srvtoolu_01",
            "toolName": "web_search",
            "args": {"query": "trains"},
            "result": [{"url": "https://example.com/trains"}],
        },
    }
    return [
        message("user", {"type": "text", "text": "Plan the trip."}),
        message(
            "assistant",
            {
                "type": "reasoning",
                "text": "Search first.",
                "providerMetadata": {"anthropic": {"signature": "sig-A"}},
            },
            search,
            {"type": "text", "text": "By train."},
        ),
        message("user", {"type": "text", "text": "And back?"}),
        message(
            "assistant",
            {
                "type": "reasoning",
                "text": "Same way.",
                "details": [{"type": "text", "signature": "enc-O"}],
                "providerMetadata": {"openai": {}},
            },
            {"type": "text", "text": "Also by train."},
        ),
        message("user", {"type": "text", "text": "Thanks."}),
    ]


async def test_anthropic_gets_back_only_what_it_signed_and_ran(address: str) -> None:
    async with App(config(address)) as app:
        prompt = await sent_prompt(app, "anthropic/claude-sonnet-4-5", history_with_provenance())
    assistants = [m["content"] for m in prompt if m["role"] == "assistant"]
    # its own signed thinking and its own server-side search stay; OpenAI's signed reasoning goes
    assert assistants[0][0] == {
        "type": "reasoning",
        "text": "Search first.",
        "provider": "anthropic",
        "signature": "sig-A",
    }
    assert [p["type"] for p in assistants[0]] == ["reasoning", "tool-call", "text"]
    assert assistants[0][1]["providerExecuted"] is True
    assert assistants[1] == [{"type": "text", "text": "Also by train."}]


async def test_another_providers_server_side_tool_is_dropped_with_its_result(address: str) -> None:
    async with App(config(address)) as app:
        prompt = await sent_prompt(app, "openai/gpt-5", history_with_provenance())
    # the strip-foreign-provider-executed-tools rule: Anthropic's web search and its result go
    assert "srvtoolu_01" not in str(prompt)
    assert part_types(prompt) == [
        ("user", ["text"]),
        ("assistant", ["reasoning", "text"]),
        ("user", ["text"]),
        ("assistant", ["reasoning", "text"]),
        ("user", ["text"]),
    ]
