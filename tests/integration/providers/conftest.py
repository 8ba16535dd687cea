"""Fake provider APIs (real sockets, one server thread each per module) and their API keys."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.config import ProviderConfig
from procmesh_orchestrator.providers import AnthropicModel, HTTPModel, OpenAIModel, ProviderConnection
from tests.integration.providers.fakes import FakeAnthropic, FakeAPI, FakeOpenAI
from tests.integration.providers.files import FileServer
from tests.integration.providers.helpers import MakeModel

OPENAI_KEY_ENV = "PROCMESH_TEST_OPENAI_KEY"
ANTHROPIC_KEY_ENV = "PROCMESH_TEST_ANTHROPIC_KEY"
OPENAI_KEY = "sk-test-openai"
ANTHROPIC_KEY = "sk-ant-test"


@pytest.fixture(scope="module")
def api_keys() -> Iterator[None]:
    """The keys in the environment, where providers read them (never from the config)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(OPENAI_KEY_ENV, OPENAI_KEY)
        mp.setenv(ANTHROPIC_KEY_ENV, ANTHROPIC_KEY)
        yield


@pytest.fixture(scope="module")
def openai_api(api_keys: None) -> Iterator[FakeOpenAI]:
    api = FakeOpenAI(api_key=OPENAI_KEY).start()
    yield api
    api.stop()


@pytest.fixture(scope="module")
def anthropic_api(api_keys: None) -> Iterator[FakeAnthropic]:
    api = FakeAnthropic(api_key=ANTHROPIC_KEY).start()
    yield api
    api.stop()


@pytest.fixture(scope="module")
def file_server() -> Iterator[FileServer]:
    """A real HTTP file server on 127.0.0.1 (attachments to download)."""
    server = FileServer()
    yield server
    server.stop()


@pytest.fixture
def files(file_server: FileServer) -> FileServer:
    """The module's file server, without the files and requests of earlier tests."""
    file_server.reset()
    return file_server


@pytest.fixture
def fresh_fakes(openai_api: FakeOpenAI, anthropic_api: FakeAnthropic) -> None:
    """Both fakes without the scripts and requests of the module's earlier tests."""
    openai_api.reset()
    anthropic_api.reset()


@pytest_asyncio.fixture
async def make_model() -> AsyncIterator[MakeModel]:
    """``make_model(api, "model-id", kind="openai", **provider_config)``; clients closed afterwards."""
    connections: list[ProviderConnection] = []

    def make(api: FakeAPI, model: str, *, kind: str, name: str = "fake", **config: Any) -> HTTPModel:
        cfg = ProviderConfig.model_validate({"kind": kind, "baseUrl": api.base_url, **config})
        connection = ProviderConnection(name, cfg)
        connections.append(connection)
        cls = OpenAIModel if kind == "openai" else AnthropicModel
        return cls(connection, model)

    yield make
    for connection in connections:
        await connection.aclose()
