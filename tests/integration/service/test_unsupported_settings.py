"""A model setting the model's API has no field for (OpenAI ``topK``, Anthropic ``seed``) is left
out of the request body, and said so, as the reference reports it (a call warning
``{type: "unsupported-setting", setting}``): in the step's ``warnings``, the result's, the stream's
``step-start`` and ``procmesh_call_settings_ignored_total{setting}``. Fake OpenAI and Anthropic
APIs on real sockets, the in-process service over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.providers.fakes import FakeAnthropic, FakeOpenAI
from tests.integration.service.support import stream_chunks

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

SETTINGS = {"temperature": 0.2, "topK": 5, "seed": 7}


@pytest.fixture(scope="module")
def apis() -> Iterator[tuple[FakeOpenAI, FakeAnthropic]]:
    openai, anthropic = FakeOpenAI(), FakeAnthropic()
    openai.start()
    anthropic.start()
    openai.script("gpt", *[{"text": "Hi."}] * 4)
    anthropic.script("claude", *[{"text": "Hi."}] * 4)
    yield openai, anthropic
    openai.stop()
    anthropic.stop()


def _config(openai: FakeOpenAI, anthropic: FakeAnthropic) -> dict[str, Any]:
    """Agent ``gpt`` on the fake OpenAI API, ``claude`` on the fake Anthropic one."""
    kinds = {"oa": ("openai", openai), "an": ("anthropic", anthropic)}
    models = {"gpt": "oa/gpt", "claude": "an/claude"}
    return {
        "providers": {name: {"kind": kind, "baseUrl": api.base_url} for name, (kind, api) in kinds.items()},
        "agents": {
            agent: {"model": model, "errorProcessorDefaults": False} for agent, model in models.items()
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(apis: tuple[FakeOpenAI, FakeAnthropic]) -> AsyncIterator[httpx.AsyncClient]:
    settings = OrchestratorSettings(http_port=0, grpc_port=0)
    svc = Service(settings, parse_config(_config(*apis)))
    async with svc, httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.http_port}", timeout=20) as client:
        yield client


@pytest.mark.parametrize(
    ("agent", "unsupported", "sent"),
    [("gpt", "topK", {"temperature": 0.2, "seed": 7}), ("claude", "seed", {"temperature": 0.2, "top_k": 5})],
)
async def test_a_setting_the_models_api_lacks_is_a_warning_of_the_step_and_the_result(
    http: httpx.AsyncClient,
    apis: tuple[FakeOpenAI, FakeAnthropic],
    agent: str,
    unsupported: str,
    sent: dict[str, object],
) -> None:
    api = apis[0] if agent == "gpt" else apis[1]
    before = len(api.calls(agent))
    body = {"messages": "hi", "modelSettings": SETTINGS}
    result = (await http.post(f"/api/agents/{agent}/generate", json=body)).json()
    assert result["status"] == "success", result
    (request,) = api.calls(agent)[before:]
    assert {k: request.body.get(k) for k in sent} == sent  # what the API has is sent
    assert not {"top_k", "topK"} & set(request.body) if agent == "gpt" else "seed" not in request.body
    model_id = "oa/gpt" if agent == "gpt" else "an/claude"
    why = f"{model_id}'s API has no such setting: it was not sent"
    warning = {"type": "unsupported-setting", "setting": unsupported, "details": why}
    assert result["steps"][0]["warnings"] == [warning]
    assert result["warnings"] == [warning]
    metrics = (await http.get("/metrics")).text
    assert f'procmesh_call_settings_ignored_total{{setting="{unsupported}"}} 1.0' in metrics

    chunks = [c for c in await stream_chunks(http, agent, body) if isinstance(c, dict)]
    (start,) = [c for c in chunks if c["type"] == "step-start"]
    assert start["payload"]["warnings"] == [warning]
    metrics = (await http.get("/metrics")).text
    assert f'procmesh_call_settings_ignored_total{{setting="{unsupported}"}} 2.0' in metrics


async def test_settings_the_api_has_give_no_warning(http: httpx.AsyncClient) -> None:
    body = {"messages": "hi", "modelSettings": {"temperature": 0.2, "seed": 7}}
    result = (await http.post("/api/agents/gpt/generate", json=body)).json()
    assert result["warnings"] == []
    assert result["steps"][0]["warnings"] == []
