"""The generate / stream options and result fields of issue 20 through the real `@mastra/client-js`.

tests/clientjs/options.mjs calls a `procmesh-orchestrator` process with ``structuredOutput`` (a zod
schema, as users write it: the client converts it to JSON schema), ``modelSettings``,
``toolChoice``, ``activeTools``, ``instructions``, an image part, a server tool and a guarded
agent, and prints the results and chunks it got. (What reaches the model request is asserted in
tests/integration/service/test_body_options.py, where the scripted model's requests are visible.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.deps import require_npm_packages
from tests.e2e.service.conftest import OrchestratorProcess
from tests.e2e.service.test_clientjs import CLIENTJS, NODE
from tests.integration.service.support import API_KEY, service_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


def _config(address: str) -> dict[str, Any]:
    config = service_config({"guards": address})
    plain = {"errorProcessorDefaults": False}
    json_answer = '{"city": "Paris", "temp": 21}'
    config["models"]["json"] = {"provider": "scripted", "responses": [{"text": json_answer}] * 10}
    config["models"]["prose"] = {"provider": "scripted", "responses": [{"text": "21 degrees."}] * 10}
    config["tools"] = {
        "weather": {
            "description": "Weather",
            "inputSchema": {"type": "object"},
            "result": {"forecast": "sunny"},
        }
    }
    config["agents"] |= {
        "json": {"model": "json", **plain},
        "prose": {"model": "prose", **plain},
        "tools": {"model": "demo", "tools": ["weather"], **plain},
    }
    return config


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def out(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> dict[str, Any]:
    require_npm_packages(CLIENTJS)
    sidecar = start_sidecar("examples", name="js-options-guards")
    await sidecar.wait_ready()
    orchestrator = await asyncio.to_thread(
        start_orchestrator, _config(sidecar.address), env={"PROCMESH_API_KEYS": API_KEY}
    )
    proc = await asyncio.to_thread(
        subprocess.run,
        [str(NODE), "options.mjs", orchestrator.http_url, API_KEY],
        cwd=CLIENTJS,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr + orchestrator.log()
    output: dict[str, Any] = json.loads(proc.stdout)
    return output


async def test_structured_output_gives_the_object(out: dict[str, Any]) -> None:
    assert (out["structured"]["status"], out["structured"]["object"]) == (
        "success",
        {"city": "Paris", "temp": 21},
    )
    strict = out["strict"]
    assert (strict["status"], strict["finishReason"], strict["object"]) == ("failed", "error", None)
    assert "structured output: the answer is not JSON" in strict["error"]
    (chunk,) = [c for c in out["structuredStream"] if c["type"] == "object-result"]
    assert chunk["object"] == {"city": "Paris", "temp": 21}


async def test_options_and_image_parts_are_accepted(out: dict[str, Any]) -> None:
    assert out["options"]["status"] == "success"
    assert out["image"]["status"] == "success"
    assert out["badSetting"]["status"] == 400
    assert "modelSettings.temprature" in out["badSetting"]["body"]["error"]


async def test_a_tool_run_has_the_references_result_fields(out: dict[str, Any]) -> None:
    tools = out["tools"]
    (call,) = tools["toolCalls"]
    assert (call["type"], call["payload"]["toolName"]) == ("tool-call", "weather")
    (result,) = tools["toolResults"]
    assert (result["type"], result["payload"]["result"]) == ("tool-result", {"forecast": "sunny"})
    assert tools["stepToolCalls"][0] == [call]
    assert tools["totalUsage"] == tools["usage"]
    assert [m["role"] for m in tools["messages"]] == ["assistant", "assistant"]
    assert tools["traceId"] is None


async def test_violations_reach_the_client(out: dict[str, Any]) -> None:
    (violation,) = out["guarded"]["violations"]
    assert violation["processorId"] == "topic-guard"
    kinds = [c["type"] for c in out["guardedStream"]]
    assert kinds.index("data-procmesh-violation") < kinds.index("tripwire")
