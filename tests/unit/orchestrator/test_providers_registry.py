"""Provider config and model resolution: ``models`` keys, ``provider/model-id``, clear errors."""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.errors import APICallError, ConfigError
from procmesh_orchestrator.providers import AnthropicModel, ModelRegistry, OpenAIModel
from procmesh_orchestrator.providers.builtin import DemoModel
from procmesh_orchestrator.run.models import ModelRequest


def config(agent_model: str, **extra: Any) -> Config:
    return parse_config({**extra, "agents": {"a": {"model": agent_model}}}, "test config")


LOCAL = {"local": {"kind": "openai", "baseUrl": "http://127.0.0.1:8080/v1/", "maxRetries": 2, "timeout": 5}}


def test_existing_configs_still_load() -> None:
    cfg = config("demo")
    assert cfg.providers == {}
    assert isinstance(ModelRegistry(cfg)["demo"], DemoModel)


def test_provider_models_are_resolved_through_providers() -> None:
    registry = ModelRegistry(config("local/qwen2.5:0.5b", providers=LOCAL))
    model = registry["local/qwen2.5:0.5b"]
    assert isinstance(model, OpenAIModel)
    assert (model.model_id, model.model) == ("local/qwen2.5:0.5b", "qwen2.5:0.5b")
    assert model.connection.config.base_url == "http://127.0.0.1:8080/v1"
    assert model.connection.retry.max_retries == 2
    assert registry["local/qwen2.5:0.5b"] is model
    # a processInputStep override may name a model the config never mentioned; same connection
    other = registry.get("local/other")
    assert isinstance(other, OpenAIModel)
    assert other.connection is model.connection


def test_model_ids_may_contain_slashes() -> None:
    model = ModelRegistry(config("local/meta-llama/Llama-3.2-1B", providers=LOCAL))[
        "local/meta-llama/Llama-3.2-1B"
    ]
    assert isinstance(model, OpenAIModel)
    assert model.model == "meta-llama/Llama-3.2-1B"


def test_openai_and_anthropic_exist_by_default() -> None:
    registry = ModelRegistry(config("anthropic/claude-sonnet-4-5"))
    model = registry["anthropic/claude-sonnet-4-5"]
    assert isinstance(model, AnthropicModel)
    assert model.connection.config.base_url == "https://api.anthropic.com"
    assert model.connection.config.api_key_env == "ANTHROPIC_API_KEY"
    assert isinstance(registry["openai/gpt-4o-mini"], OpenAIModel)


def test_a_declared_provider_overrides_a_default() -> None:
    providers = {"openai": {"kind": "openai", "baseUrl": "http://gateway.test/v1"}}
    model = ModelRegistry(config("openai/x", providers=providers))["openai/x"]
    assert isinstance(model, OpenAIModel)
    assert model.connection.config.base_url == "http://gateway.test/v1"
    assert model.connection.config.api_key_env is None


@pytest.mark.parametrize(
    ("model", "problem"),
    [
        (
            "nope/x",
            "agents.a.model: unknown provider 'nope' in 'nope/x' (providers: ['anthropic', 'openai'])",
        ),
        ("gpt", "agents.a.model: unknown model 'gpt' (models: ['demo']; or name a provider model as"),
        ("local/", "agents.a.model: unknown model 'local/'"),
    ],
)
def test_unknown_models_and_providers_name_the_key(model: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        config(model)
    assert problem in str(info.value)


def test_unknown_override_is_none_and_resolve_names_the_key() -> None:
    registry = ModelRegistry(config("demo"))
    assert registry.get("nope/x") is None
    assert registry.get("gpt") is None
    with pytest.raises(ConfigError, match=r"^agents\.b\.model: unknown provider 'nope'"):
        registry.resolve("nope/x", "agents.b.model")


@pytest.mark.parametrize(
    ("providers", "problem"),
    [
        ({"a/b": {"kind": "openai"}}, "must be non-empty and contain no '/'"),
        ({"x": {"kind": "gemini"}}, "providers.x.kind"),
        (
            {"x": {"kind": "openai", "baseUrl": "127.0.0.1:8080"}},
            "baseUrl must start with http:// or https://",
        ),
        (
            {"x": {"kind": "openai", "apiKey": "sk-in-the-file"}},
            "providers.x.apiKey: Extra inputs are not permitted",
        ),
        ({"x": {"kind": "openai", "maxRetries": -1}}, "providers.x.maxRetries"),
    ],
)
def test_provider_config_is_validated(providers: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        config("demo", providers=providers)
    assert problem in str(info.value)


async def test_a_missing_key_fails_when_the_model_is_first_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROCMESH_UNIT_KEY", raising=False)
    providers = {"cloud": {"kind": "anthropic", "apiKeyEnv": "PROCMESH_UNIT_KEY"}}
    registry = ModelRegistry(config("cloud/claude-x", providers=providers))
    model = registry["cloud/claude-x"]  # building the model needs no key
    with pytest.raises(APICallError) as info:
        await anext(aiter(model.stream(ModelRequest(prompt=[]))))
    assert str(info.value) == (
        "providers.cloud.apiKeyEnv: environment variable PROCMESH_UNIT_KEY is not set "
        "(needed by model 'cloud/claude-x')"
    )
    assert (info.value.retryable, info.value.error_id) == (False, "API_KEY_MISSING")
    await registry.aclose()
