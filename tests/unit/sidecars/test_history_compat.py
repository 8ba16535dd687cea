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
