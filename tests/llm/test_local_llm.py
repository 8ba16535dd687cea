"""Opt-in: an App agent on a real local model (``make test-llm`` starts llama.cpp's server).

Not collected by ``make test`` (tests/conftest.py leaves this folder out unless
PROCMESH_LLM_BASE_URL names an OpenAI-compatible endpoint, e.g. ``http://127.0.0.1:8080/v1``).
"""

from __future__ import annotations

import os

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import parse_config

BASE_URL = os.environ.get("PROCMESH_LLM_BASE_URL", "")


@pytest.fixture(autouse=True)
def _base_url() -> None:
    if not BASE_URL:
        pytest.fail("PROCMESH_LLM_BASE_URL is not set: run `make test-llm`, which starts the model server")


async def test_a_local_model_answers_streamed_and_generated() -> None:
    config = parse_config(
        {
            "providers": {"local": {"kind": "openai", "baseUrl": BASE_URL, "timeout": 120, "maxTokens": 48}},
            "agents": {"a": {"model": "local/gemma", "instructions": "Answer in one short sentence."}},
        },
        "llm test config",
    )
    async with App(config) as app:
        agent = app.agent("a")
        generated = await agent.generate("What is the capital of France?")
        run = agent.stream("Name one colour.")
        chunks = [chunk async for chunk in run]
        streamed = await run.result()

    assert generated.error is None
    assert generated.text.strip()
    assert generated.usage["outputTokens"] > 0
    assert streamed.error is None
    assert streamed.text.strip()
    assert [c["type"] for c in chunks].count("text-delta") >= 1
