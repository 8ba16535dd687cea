"""HTTP model providers and the registry that resolves an agent's ``model`` to a `ModelProvider`.

A model reference is a key of the config's ``models`` (the built-in ``demo`` and
``scripted`` models) or ``provider/model-id``, resolved through ``providers``
(``openai`` and ``anthropic`` exist by default). One wire format per module:
`orchestrator.providers.openai`, `orchestrator.providers.anthropic`.
"""

from __future__ import annotations

import asyncio

import httpx

from procmesh_orchestrator.config import Config, ProviderConfig
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.providers._base import HTTPModel, ProviderConnection
from procmesh_orchestrator.providers.anthropic import AnthropicModel
from procmesh_orchestrator.providers.builtin import make_model
from procmesh_orchestrator.providers.embeddings import EmbeddingModel
from procmesh_orchestrator.providers.openai import OpenAIModel
from procmesh_orchestrator.run.models import ModelProvider

__all__ = [
    "AnthropicModel",
    "EmbeddingModel",
    "HTTPModel",
    "ModelRegistry",
    "OpenAIModel",
    "ProviderConnection",
]

_KINDS: dict[str, type[HTTPModel]] = {"openai": OpenAIModel, "anthropic": AnthropicModel}


class ModelRegistry(dict[str, ModelProvider]):
    """The App's models by reference; ``provider/model-id`` entries are created on first lookup.

    A dict, so the agent loop's ``models.get(id)`` (a processInputStep model
    override) also resolves provider models nobody named in the config. Models
    of one provider share its `ProviderConnection`; `aclose()` closes them all.
    """

    def __init__(self, config: Config, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__({name: make_model(name, m) for name, m in config.models.items()})
        self._config = config
        self._transport = transport
        self._connections: dict[str, ProviderConnection] = {}

    def __missing__(self, ref: str) -> ModelProvider:
        problem = self._config.model_problem(ref)
        if problem is not None:
            raise KeyError(ref)
        provider, _, model_id = ref.partition("/")
        config = self._config.provider(provider)
        assert config is not None  # model_problem checked it
        model = self.provider_model(provider, config, model_id)
        self[ref] = model
        return model

    def get(self, ref: str, default: ModelProvider | None = None) -> ModelProvider | None:  # type: ignore[override]
        """The model `ref` names (created when it is a new provider model), else `default`."""
        try:
            return self[ref]
        except KeyError:
            return default

    def resolve(self, ref: str, where: str) -> ModelProvider:
        """The model `ref` names; a `ConfigError` naming `where` and the problem otherwise."""
        problem = self._config.model_problem(ref)
        if problem is not None:
            raise ConfigError(f"{where}: {problem}")
        return self[ref]

    def provider_model(self, provider: str, config: ProviderConfig, model_id: str) -> HTTPModel:
        """A model of `provider` sharing the provider's connection."""
        return _KINDS[config.kind](self._connection(provider, config), model_id)

    def embedder(self, ref: str) -> EmbeddingModel:
        """The embedding model ``provider/model-id`` (the config checked it names an ``openai``-kind
        provider), sharing the provider's connection with its chat models."""
        provider, _, model_id = ref.partition("/")
        config = self._config.provider(provider)
        assert config is not None  # Config._references checked it names an openai-kind provider
        return EmbeddingModel(self._connection(provider, config), model_id)

    def _connection(self, provider: str, config: ProviderConfig) -> ProviderConnection:
        connection = self._connections.get(provider)
        if connection is None:
            connection = ProviderConnection(provider, config, transport=self._transport)
            self._connections[provider] = connection
        return connection

    async def aclose(self) -> None:
        """Close every provider's HTTP client."""
        await asyncio.gather(*(c.aclose() for c in self._connections.values()))
