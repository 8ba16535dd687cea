"""Which models the gateway serves (every place the config names one) and its bounded labels."""

from __future__ import annotations

from typing import Any

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.config.lanes import option_models
from procmesh_orchestrator.service.grpc.gateway_policy import GatewayModels, on_local_socket, shown


def _models(raw: dict[str, Any]) -> GatewayModels:
    return GatewayModels.of(parse_config(raw))


CONFIG: dict[str, Any] = {
    "sidecars": {"g": {"address": "127.0.0.1:1"}},
    "models": {"main": {"provider": "scripted"}},
    "prices": {"openai/priced-only": {"input": 1, "output": 1}},
    "workflows": {
        "judged": {
            "steps": [
                {"parallel": [{"processor": "g/a", "options": {"judge_model": "openai/in-workflow"}}]},
                {
                    "when": {"tier": "pro"},
                    "then": [{"processor": "g/b", "options": {"model": "openai/when"}}],
                },
            ]
        },
        "unused": {"steps": [{"processor": "g/c", "options": {"model": "openai/unused-workflow"}}]},
    },
    "agents": {
        "one": {
            "model": [
                {"model": "main"},
                {"model": "openai/fallback"},
                {"model": "openai/off", "enabled": False},
            ],
            "inputProcessors": [
                {"processor": "g/moderation", "name": "mod", "options": {"model": "openai/judge"}},
                "workflow:judged",
            ],
            "outputProcessors": [
                {
                    "processor": "g/deep",
                    "options": {"levels": [{"scoringModel": "anthropic/nested"}], "n": 3},
                },
                {
                    "processor": "g/flag",
                    "options": {"preserve_model_output": True, "note": "openai/not-a-model"},
                },
            ],
        },
        "two": {
            "model": "openai/judge",
            "outputProcessorsByContext": {
                "key": "tier",
                "cases": {"pro": [{"processor": "g/judge", "options": {"model": "openai/pro-case"}}]},
                "default": [{"processor": "g/judge", "options": {"model": "openai/default-case"}}],
            },
        },
    },
}


def test_every_model_the_config_names_is_known_with_the_agents_naming_it() -> None:
    models = _models(CONFIG)
    assert models.agents_of == {
        "main": ("one",),
        "openai/priced-only": (),
        "openai/in-workflow": ("one",),
        "openai/when": ("one",),
        "openai/unused-workflow": (),
        "openai/fallback": ("one",),
        "openai/judge": ("one", "two"),
        "anthropic/nested": ("one",),
        "openai/pro-case": ("two",),
        "openai/default-case": ("two",),
    }
    assert not models.knows("openai/off")  # a disabled fallback is no model of the agent
    assert not models.knows("openai/not-a-model")  # an option value under a key naming no model


def test_a_model_option_from_the_request_context_names_its_default_and_cases() -> None:
    per_run = {"fromContext": "tier", "cases": {"pro": "openai/pro"}, "default": "openai/basic"}
    options = {"model": per_run, "note": {"fromContext": "x", "default": "openai/not-a-model"}}
    assert sorted(option_models(options)) == ["openai/basic", "openai/pro"]


def test_labels_are_the_configs_names_or_one_fixed_value() -> None:
    models = _models(CONFIG)
    assert models.model_label("openai/judge") == "openai/judge"
    assert models.model_label("openai/anything-else") == "other"
    assert models.model_label("x\ny") == "other"
    for known in ("moderation", "g/moderation", "mod", "a", "c"):
        assert models.processor_label(known) == known
    assert models.processor_label("p-1234") == "other"
    assert models.processor_label("") == "unknown"


def test_caller_text_is_shown_escaped_and_cut() -> None:
    assert shown("a\nERROR forged") == "'a\\nERROR forged'"
    assert shown("x" * 100) == repr("x" * 64 + "...")
    assert shown("\u2028\x1b[31m") == "'\\u2028\\x1b[31m'"


def test_only_a_unix_peer_is_on_the_local_socket() -> None:
    assert on_local_socket("unix:")
    assert on_local_socket("unix:/run/procmesh/orchestrator.sock")
    assert not on_local_socket("ipv4:127.0.0.1:5000")
    assert not on_local_socket("ipv6:[::1]:5000")
