"""The generate / stream options and result fields of issue 20 through the real `@mastra/client-js`.

tests/clientjs/options.mjs calls a `procmesh-orchestrator` process with ``structuredOutput`` (a zod
schema, as users write it: the client converts it to JSON schema), ``modelSettings``,
``toolChoice``, ``activeTools``, ``instructions``, an image part, a server tool, a guarded
agent and per-call processor lists (the orchestrator trusts its callers, so it honours them), and
prints the results and chunks it got. (What reaches the model request is asserted in
tests/integration/service/test_body_options.py, where the scripted model's requests are visible.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess, run_clientjs
from tests.integration.service.support import API_KEY, API_KEYS, demo_answer, service_config

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
    config["workflows"] = {"redact": {"steps": ["guards/pii-redactor"]}}
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
    sidecar = start_sidecar("examples", name="js-options-guards")
    await sidecar.wait_ready()
    # an operator key (an auth proxy's): it may replace an agent's processor lanes
    env = {"PROCMESH_API_KEYS": API_KEYS}
    orchestrator = await asyncio.to_thread(start_orchestrator, _config(sidecar.address), env=env)
    output: dict[str, Any] = await asyncio.to_thread(run_clientjs, "options.mjs", orchestrator, API_KEY)
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
    # the client sends jsonPromptInjection as the user gave it (the prompt-only request it makes:
    # test_body_options.test_json_prompt_injection_sends_the_schema_in_the_prompt_alone)
    injected = out["injected"]
    assert (injected["status"], injected["object"]) == ("success", {"city": "Paris", "temp": 21})


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


async def test_per_call_processor_lists_replace_the_agents_lanes(out: dict[str, Any]) -> None:
    # none: the topic guard lets the jailbreak through, the word filter masks nothing
    assert (out["noProcessors"]["status"], out["noProcessors"]["text"]) == (
        "success",
        demo_answer("please jailbreak"),
    )
    # a processor object, named by its id: the redactor instead of the guard; the agent's output lane
    assert out["redacting"]["text"] == demo_answer("mail [email]").replace("Darn", "****")
    chunks = out["redactingStream"]
    text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
    assert text == demo_answer("mail [email]")
    # a processor workflow by its name, in an input lane; the error lane takes processors only
    assert out["workflowLane"]["text"] == demo_answer("mail [email]")
    refused = out["workflowErrorLane"]
    assert (refused["status"], refused["body"]["error"]) == (
        400,
        "errorProcessors.0: the error lane takes processors, not the workflow 'workflow:redact'",
    )


async def test_a_processor_the_orchestrator_cannot_name_is_refused(out: dict[str, Any]) -> None:
    unknown = out["unknownProcessor"]
    assert unknown["status"] == 400
    assert unknown["body"]["error"].startswith("inputProcessors.0: unknown processor 'nope' (known: ")
    assert "pii-redactor" in unknown["body"]["error"]
    code = out["codeProcessor"]
    assert code["status"] == 501
    assert "processors defined in the caller's code are not supported by procmesh" in code["body"]["error"]
