"""provider-history-compat's rule language, hook by hook (the processor called directly)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from procmesh_sidecars.history_compat import ProviderHistoryCompat, ProviderHistoryCompatOptions

NO_RULES = ProviderHistoryCompatOptions()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


async def sent(
    prompt: list[dict[str, Any]], model: str, options: ProviderHistoryCompatOptions = NO_RULES
) -> Any:
    result = await ProviderHistoryCompat().process_llm_request(prompt, model, {}, options)
    return prompt if result is None else result["prompt"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<system-reminder>a</system-reminder>", "<memory-context>a</memory-context>"),
        (
            '<system-reminder type="x" step="2">a</system-reminder>',
            '<memory-context type="x" step="2">a</memory-context>',
        ),
        ("<system-reminder/> and <system-reminder />", "<memory-context/> and <memory-context />"),
        ("<system-reminders>a</system-reminders>", "<system-reminders>a</system-reminders>"),
    ],
)
async def test_the_azure_rule_renames_the_wrapper_only(text: str, expected: str) -> None:
    [msg] = await sent([user(text)], "azure-openai/gpt-4o")
    assert msg["content"][0]["text"] == expected


async def test_the_azure_rule_rewrites_system_and_user_text_not_the_assistants() -> None:
    assistant = {
        "role": "assistant",
        "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"}],
    }
    prompt = [{"role": "system", "content": "<system-reminder>s</system-reminder>"}, assistant]
    system, kept = await sent(prompt, "azure:gpt-4o")
    assert system["content"] == "<memory-context>s</memory-context>"
    assert kept is assistant


async def test_tool_ids_are_rewritten_in_calls_and_results_alike() -> None:
    prompt = [
        {
            "role": "assistant",
            "content": [{"type": "tool-call", "toolCallId": "a.b", "toolName": "t", "input": {}}],
        },
        {
            "role": "tool",
            "content": [{"type": "tool-result", "toolCallId": "a.b", "toolName": "t", "output": 1}],
        },
    ]
    call, result = await sent(prompt, "bedrock/anthropic.claude-3-5-sonnet")
    assert call["content"][0]["toolCallId"] == result["content"][0]["toolCallId"] == "a_b"


async def test_a_rule_is_retried_once_and_only_when_it_would_change_the_prompt() -> None:
    options = ProviderHistoryCompatOptions.model_validate(
        {
            "additional_rules": [
                {
                    "name": "x",
                    "error_patterns": ["no tabs"],
                    "replace": [{"pattern": "\t", "replacement": " "}],
                }
            ]
        }
    )
    processor, state = ProviderHistoryCompat(), {}
    rejection = {"message": "Bad request", "body": '{"error": "No tabs allowed"}'}  # the body matches

    assert await processor.process_llm_request([user("a b")], "local/m", state, options) is None
    assert await processor.process_api_error(rejection, 0, state, options) is None  # nothing to fix

    assert await processor.process_llm_request([user("a\tb")], "local/m", state, options) is None
    assert await processor.process_api_error(rejection, 1, state, options) is None  # a retry already
    assert await processor.process_api_error({"message": "other"}, 0, state, options) is None
    assert await processor.process_api_error(rejection, 0, state, options) == {"retry": True}
    # on for the rest of the run
    assert await processor.process_llm_request([user("c\td")], "local/m", state, options) == {
        "prompt": [user("c d")]
    }


@pytest.mark.parametrize(
    "rule",
    [
        {"name": "x", "replace": [{"pattern": "(a)\\1", "replacement": ""}]},  # a backreference
        {"name": "x", "model": "(", "strip_reasoning": True},
        {"name": "x", "tool_ids": {"invalid": "[", "replacement": "_"}},
    ],
)
def test_a_pattern_re2_refuses_is_an_options_error(rule: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="RE2"):
        ProviderHistoryCompatOptions.model_validate({"additional_rules": [rule]})


def test_rule_names_are_unique() -> None:
    rule = {"name": "x", "strip_reasoning": True}
    with pytest.raises(ValidationError, match=r"\['x'\]"):
        ProviderHistoryCompatOptions.model_validate({"additional_rules": [rule, rule]})


def assistant(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(parts)}


def search_call(call_id: str, provider: str) -> dict[str, Any]:
    return {
        "type": "tool-call",
        "toolCallId": call_id,
        "toolName": "web_search",
        "input": {"q": "x"},
        "providerExecuted": True,
        "provider": provider,
    }


def search_result(call_id: str) -> dict[str, Any]:
    return {"type": "tool-result", "toolCallId": call_id, "toolName": "web_search", "output": "found"}


@pytest.mark.parametrize(
    ("model", "kept"),
    [("anthropic/claude-sonnet-4-5", ["tool-call", "tool-result"]), ("openai/gpt-5", [])],
)
async def test_another_providers_executed_tools_are_dropped_with_their_results(
    model: str, kept: list[str]
) -> None:
    prompt = [
        user("find it"),
        assistant(search_call("srvtoolu_1", "anthropic"), search_result("srvtoolu_1")),
        assistant({"type": "text", "text": "Found."}),
        user("thanks"),
    ]
    out = await sent(prompt, model)
    if kept:
        assert out == prompt  # the provider's own: kept
    else:
        assert [m["content"] for m in out] == [
            prompt[0]["content"],
            prompt[2]["content"],
            prompt[3]["content"],
        ]


async def test_a_client_side_tool_call_is_never_dropped() -> None:
    call = {
        "type": "tool-call",
        "toolCallId": "c1",
        "toolName": "weather",
        "input": {},
        "provider": "anthropic",
    }
    prompt = [user("q"), assistant(call), {"role": "tool", "content": [search_result("c1")]}]
    assert await sent(prompt, "openai/gpt-5") == prompt


def thinking(text: str, provider: str = "", signature: str = "") -> dict[str, Any]:
    part: dict[str, Any] = {"type": "reasoning", "text": text}
    if provider:
        part["provider"] = provider
    if signature:
        part["signature"] = signature
    return part


async def test_anthropic_keeps_only_the_reasoning_it_signed() -> None:
    own = thinking("mine", "anthropic", "sig-a")
    prompt = [
        user("q"),
        assistant(
            own, thinking("unsigned", "anthropic"), thinking("theirs", "openai", "enc-o"), thinking("bare")
        ),
        assistant({"type": "text", "text": "a"}),
    ]
    out = await sent(prompt, "anthropic/claude-sonnet-4-5")
    assert out[1]["content"] == [own]


async def test_your_rule_drops_only_what_another_provider_signed() -> None:
    rule = {"name": "house-foreign-signed", "model": "^house/", "strip_reasoning": "foreign-signed"}
    options = ProviderHistoryCompatOptions.model_validate({"additional_rules": [rule]})
    prompt = [
        user("q"),
        assistant(
            thinking("theirs", "anthropic", "sig-a"), thinking("unsigned"), thinking("own", "house", "s")
        ),
    ]
    out = await sent(prompt, "house/reasoner", options)
    assert out[1]["content"] == [thinking("unsigned"), thinking("own", "house", "s")]
