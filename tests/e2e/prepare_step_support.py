"""What the prepareStep tests share (tests/e2e/test_prepare_step.py in process,
tests/e2e/service/test_prepare_steps.py over HTTP): a scripted processor in a real sidecar process
that asks for ``toolChoice: required`` at every step, an agent over a fake OpenAI API calling it,
readers of what that API received, and the fixtures `api` and `model`, which both modules import
under their function names (so that a test's `model` argument does not shadow an import)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.integration.providers.fakes import FakeOpenAI, Recorded

WEATHER_CALL = {"toolCalls": [{"id": "c1", "name": "weather", "args": {"city": "Paris"}}]}
FORCE_TOOLS = {"id": "force-tools", "processInputStep": [{"do": [{"toolChoice": "required"}]}]}


async def force_tools_sidecar(start_sidecar: Callable[..., SidecarProcess], folder: Path, name: str) -> str:
    """Start the sidecar hosting ``force-tools``; its address."""
    scenario = folder / f"{name}.json"
    scenario.write_text(json.dumps({"agent": {"inputProcessors": [FORCE_TOOLS]}}))
    proc = start_sidecar("scripted", "--scenario", str(scenario), name=name)
    await proc.wait_ready()
    return proc.address


def agent_config(sidecar: str, api: FakeOpenAI) -> dict[str, Any]:
    """Agent ``a``: model ``local/big`` (``local/small`` may be chosen), the tools ``weather`` and
    ``news``, instructions, and ``force-tools`` in its input lane."""
    tool = {"inputSchema": {"type": "object"}, "result": {"sky": "clear"}}
    return {
        "sidecars": {"scripted": {"address": sidecar}},
        "providers": {"local": {"kind": "openai", "baseUrl": api.base_url}},
        "tools": {"weather": {"description": "Weather", **tool}, "news": {"description": "News", **tool}},
        "agents": {
            "a": {
                "model": "local/big",
                "instructions": "Agent instructions.",
                "tools": ["weather", "news"],
                "inputProcessors": ["scripted/force-tools"],
                "errorProcessorDefaults": False,
            }
        },
    }


@pytest.fixture(scope="module", name="api")
def api_fixture() -> Iterator[FakeOpenAI]:
    """The fake OpenAI API on a real socket, one per test module importing it."""
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture(name="model")
def model_fixture(api: FakeOpenAI) -> FakeOpenAI:
    """The fake API, scripted afresh: ``big`` calls the weather tool, then answers; ``small`` answers."""
    api.reset()
    api.script("big", WEATHER_CALL, {"text": "from big"})
    api.script("small", {"text": "from small"})
    return api


def tools(call: Recorded) -> list[str]:
    """The tools a model request offered, by name."""
    return [t["function"]["name"] for t in call.body.get("tools") or []]


def systems(call: Recorded) -> list[str]:
    """A model request's system messages."""
    return [m["content"] for m in call.body["messages"] if m["role"] == "system"]
