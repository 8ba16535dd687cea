"""prepareSteps over HTTP (SEED-GAPS B28): the declarative prepareStep, through the real
`@mastra/client-js` (tests/clientjs/prepare_steps.mjs) and httpx, against an orchestrator process.

The agent's model is served by a fake OpenAI API on a real socket, whose received requests are
what is asserted; its input lane holds a scripted processor in a real sidecar process asking
for ``toolChoice: required`` at every step, which a rule's override replaces at its step (the
rules run after the lane, as the reference places prepareStep).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from google.protobuf import struct_pb2

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.prepare_step_support import (  # noqa: F401 (fixtures)
    agent_config,
    api_fixture,
    force_tools_sidecar,
    model_fixture,
    systems,
    tools,
)
from tests.e2e.service.conftest import OrchestratorProcess, run_clientjs
from tests.integration.providers.fakes import FakeOpenAI
from tests.integration.service.support import API_KEY, API_KEYS, AUTH, GRPC_AUTH

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    api: FakeOpenAI,
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    sidecar_dir: Path,
) -> OrchestratorProcess:
    sidecar = await force_tools_sidecar(start_sidecar, sidecar_dir, "prepare-steps")
    config = agent_config(sidecar, api)
    env = {"PROCMESH_API_KEYS": API_KEYS}
    return await asyncio.to_thread(start_orchestrator, config, env=env)


async def _clientjs(orchestrator: OrchestratorProcess, case: str) -> Any:
    return await asyncio.to_thread(run_clientjs, "prepare_steps.mjs", orchestrator, API_KEY, case)


async def test_a_rule_switches_model_and_tool_choice_from_its_step(
    orchestrator: OrchestratorProcess, model: FakeOpenAI
) -> None:
    assert await _clientjs(orchestrator, "switched") == {"status": "success", "text": "from small"}
    (first,) = model.calls("big")
    (second,) = model.calls("small")
    assert first.body["tool_choice"] == "required"  # the lane's: no rule for step 0
    assert (second.body["tool_choice"], tools(second)) == ("none", ["weather", "news"])


async def test_a_streamed_call_narrows_the_tools_and_the_system_of_one_step(
    orchestrator: OrchestratorProcess, model: FakeOpenAI
) -> None:
    assert await _clientjs(orchestrator, "narrowed") == {"text": "from big"}
    first, second = model.calls("big")
    assert (tools(first), systems(first)) == (["weather"], ["Be brief."])
    assert (tools(second), systems(second)) == (["weather", "news"], ["Agent instructions."])


async def test_the_client_gets_a_400_naming_a_key_or_a_model_it_got_wrong(
    orchestrator: OrchestratorProcess, model: FakeOpenAI
) -> None:
    key = await _clientjs(orchestrator, "unknownKey")
    assert key["status"] == 400
    assert key["body"]["error"].startswith("prepareSteps.0.override.colour: Extra inputs are not permitted")
    unknown = await _clientjs(orchestrator, "unknownModel")
    assert unknown["status"] == 400
    assert unknown["body"]["error"].startswith("prepareSteps: unknown model 'nowhere' (configured: ")
    assert model.requests == []  # refused before any run


@pytest.mark.parametrize(
    ("steps", "error"),
    [
        ({"when": {"stepNumber": 0}}, r"^prepareSteps: Input should be a valid list"),
        ([{"when": {"stepNumber": 0}}], r"^prepareSteps\.0\.override: Field required"),
        ([{"when": {}, "override": {"toolChoice": "none"}}], r"give one of stepNumber and fromStepNumber"),
        (
            [{"when": {"stepNumber": 1, "fromStepNumber": 2}, "override": {"toolChoice": "none"}}],
            r"^prepareSteps\.0\.when: give one of stepNumber and fromStepNumber",
        ),
        ([{"when": {"afterTool": "weather"}, "override": {}}], r"prepareSteps\.0\.when\.afterTool: Extra"),
        (
            [{"when": {"stepNumber": -1}, "override": {"toolChoice": "none"}}],
            r"prepareSteps\.0\.when\.stepNumber",
        ),
        ([{"when": {"stepNumber": 0}, "override": {}}], r"^prepareSteps\.0\.override: it changes nothing"),
        (
            [{"when": {"stepNumber": 0}, "override": {"toolChoice": "sometimes"}}],
            r"^prepareSteps\.0\.override\.toolChoice",
        ),
        (
            [{"when": {"stepNumber": 0}, "override": {"modelSettings": {"temprature": 1}}}],
            r"prepareSteps\.0\.override\.modelSettings\.temprature: Extra inputs",
        ),
    ],
)
async def test_rules_are_validated_strictly(
    orchestrator: OrchestratorProcess, model: FakeOpenAI, steps: Any, error: str
) -> None:
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=20) as http:
        response = await http.post("/api/agents/a/generate", json={"messages": "hi", "prepareSteps": steps})
    assert response.status_code == 400, response.text
    assert re.search(error, response.json()["error"]), response.json()["error"]
    assert model.requests == []


async def test_a_prepare_step_function_points_at_the_declarative_form(
    orchestrator: OrchestratorProcess,
) -> None:
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=AUTH, timeout=20) as http:
        response = await http.post("/api/agents/a/generate", json={"messages": "hi", "prepareStep": {}})
    assert response.status_code == 400
    assert "cannot cross HTTP: give prepareSteps, its declarative form" in response.json()["error"]


async def test_grpc_takes_the_same_rules(orchestrator: OrchestratorProcess, model: FakeOpenAI) -> None:
    def rule(when: dict[str, Any], override: dict[str, Any]) -> struct_pb2.Struct:
        return convert.to_struct({"when": when, "override": override})

    switch = rule({"fromStepNumber": 1}, {"model": "local/small", "toolChoice": "none"})
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        stub = agrpc.AgentServiceStub(channel)
        response = await stub.Generate(
            apb.GenerateRequest(agent_id="a", text="weather in Paris?", prepare_steps=[switch]),
            metadata=GRPC_AUTH,
            timeout=30,
        )
        assert response.text == "from small"
        assert [c.body["tool_choice"] for c in model.calls("small")] == ["none"]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Generate(
                apb.GenerateRequest(
                    agent_id="a", text="hi", prepare_steps=[rule({"stepNumber": 1.5}, {"model": "nowhere"})]
                ),
                metadata=GRPC_AUTH,
                timeout=30,
            )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prepareSteps.0.when.stepNumber" in str(refused.value.details())
