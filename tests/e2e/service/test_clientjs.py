"""The real `@mastra/client-js` (npm, on Node 22 from npm) calls procmesh agents unchanged.

tests/clientjs/agents.mjs does ``new MastraClient({baseUrl}).getAgent(id).generate(...)`` and
``.stream(...)`` + ``processDataStream({onChunk})`` against a `procmesh-orchestrator`
process and prints what it got; this test checks it. CI installs the package with
``npm ci`` in tests/clientjs.

tests/clientjs/tools.mjs runs a client tool (``clientTools`` with ``execute``) through
``generate`` and ``stream``, without and with a memory thread, and approves and declines calls of
a server tool that needs approval (``approveToolCall``, ``declineToolCall`` and their ``-Generate``
twins, ``listSuspendedRuns``). Those agents answer with the demo model, which calls ``weather``
when the prompt asks about the weather and then answers from the tool's result: the final text can
hold the client tool's result only if it went client -> orchestrator -> model. (A scripted
model's second answer is fixed in the config, so it could not show that; the demo model calls
no other tool, hence the client tool's name.)
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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clientjs_output(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> dict[str, Any]:
    sidecar = start_sidecar("examples", name="js-guards")
    await sidecar.wait_ready()
    orchestrator = await asyncio.to_thread(
        start_orchestrator, service_config({"guards": sidecar.address}), env={"PROCMESH_API_KEYS": API_KEYS}
    )
    output: dict[str, Any] = await asyncio.to_thread(run_clientjs, "agents.mjs", orchestrator, API_KEY)
    return output


async def test_generate_returns_the_text(clientjs_output: dict[str, Any]) -> None:
    assert clientjs_output["agents"] == ["assistant", "concise", "slow"]
    generated = clientjs_output["generate"]
    assert generated["text"] == demo_answer("hello").replace("Darn", "****")
    assert generated["finishReason"] == "stop"
    assert generated["runId"]


async def test_stream_delivers_text_delta_chunks(clientjs_output: dict[str, Any]) -> None:
    chunks = clientjs_output["stream"]
    assert chunks[0]["type"] == "start"
    assert chunks[-1]["type"] == "finish"
    run_id = chunks[0]["runId"]
    assert all(c["runId"] == run_id and c["from"] == "AGENT" for c in chunks)
    text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
    assert text == demo_answer("hello").replace("Darn", "****")


async def test_stream_delivers_the_tripwire_chunk_of_a_guarded_agent(clientjs_output: dict[str, Any]) -> None:
    chunks = clientjs_output["guarded"]
    tripwire = chunks[-1]
    assert tripwire["type"] == "tripwire"
    assert tripwire["payload"]["processorId"] == "topic-guard"
    assert tripwire["payload"]["reason"] == "Blocked: the request mentions 'jailbreak'"
    assert not [c for c in chunks if c["type"] == "text-delta"]


async def test_a_client_without_the_key_gets_401(clientjs_output: dict[str, Any]) -> None:
    assert clientjs_output["unauthenticated"] == {
        "status": 401,
        "body": {"error": "missing API key: send the header 'Authorization: Bearer <key>'"},
    }


TOOLS_KEYS = "key-ada=user-ada"


def tools_config(data_dir: str) -> dict[str, Any]:
    """`helper` (no memory) and `keeper` (memory) for the client's tool; `teller`'s `weather`
    needs approval. The store keeps the threads and the suspended runs."""
    agent = {"model": "demo", "errorProcessorDefaults": False}
    memory = {"lastMessages": 20}
    return {
        "storage": {"backend": "sqlite", "dataDir": data_dir},
        "models": {"demo": {"provider": "demo"}},
        "tools": {
            "weather": {
                "description": "The weather in a city.",
                "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
                "result": {"forecast": "sunny"},
                "requireApproval": True,
            }
        },
        "agents": {
            "helper": agent,
            "keeper": {**agent, "memory": memory},
            "teller": {**agent, "tools": ["weather"], "memory": memory},
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tools_output(
    start_orchestrator: Callable[..., OrchestratorProcess], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    config = tools_config(str(tmp_path_factory.mktemp("memory")))
    orchestrator = await asyncio.to_thread(start_orchestrator, config, env={"PROCMESH_API_KEYS": TOOLS_KEYS})
    output: dict[str, Any] = await asyncio.to_thread(
        run_clientjs, "tools.mjs", orchestrator, "key-ada", "user-ada"
    )
    return output


def tool_answer(result: Any) -> str:
    """What the demo model answers once a tool returned `result`."""
    return f"The tool says: {result}. That should answer it."


def drizzle(label: str) -> dict[str, str]:
    """What the client tool returns in tools.mjs for one call of the script."""
    return {"forecast": f"drizzle-{label}", "city": "Paris"}


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")


def parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    return list(message["content"]["parts"])


def assert_one_turn(messages: list[dict[str, Any]], result: Any) -> None:
    """The thread holds the turn once: the question, the call settled with `result`, the answer."""
    assert [m["role"] for m in messages] == ["user", "assistant", "assistant"]
    assert len({m["id"] for m in messages}) == 3
    text, invocation = parts(messages[1])
    assert text == {"type": "text", "text": "Let me check."}
    assert invocation["toolInvocation"]["state"] == "result"
    assert invocation["toolInvocation"]["toolName"] == "weather"
    assert invocation["toolInvocation"]["result"] == result
    assert parts(messages[2]) == [{"type": "text", "text": tool_answer(result)}]


async def test_generate_runs_the_client_tool_and_answers_from_its_result(
    tools_output: dict[str, Any],
) -> None:
    assert tools_output["generate"] == {
        "text": tool_answer(drizzle("generate")),
        "finishReason": "stop",
        "status": "success",
    }
    labels = [e["label"] for e in tools_output["executed"]]
    assert labels == ["generate", "stream", "generate-memory", "stream-memory"], "each tool ran once"
    assert all(e["args"] == {"city": "Paris"} for e in tools_output["executed"])


async def test_a_client_tools_model_output_is_what_the_model_answers_from(
    tools_output: dict[str, Any],
) -> None:
    """toModelOutput runs in the client, which sends its output on the tool result
    (providerOptions.mastra.modelOutput): the model sees it instead of the result, as the
    reference server's does (generate and stream, no thread)."""
    for text in (tools_output["mappedGenerate"], text_of(tools_output["mappedStream"])):
        assert "mapped hail" in text
        assert "forecast" not in text


async def test_stream_runs_the_client_tool_and_streams_the_continuation(tools_output: dict[str, Any]) -> None:
    chunks = tools_output["stream"]
    kinds = [c["type"] for c in chunks]
    first_finish = kinds.index("finish")
    assert chunks[first_finish]["payload"]["finishReason"] == "tool-calls"
    (call,) = [c["payload"] for c in chunks if c["type"] == "tool-call"]
    (result,) = [c["payload"] for c in chunks if c["type"] == "tool-result"]
    assert (call["toolName"], result["toolCallId"]) == ("weather", call["toolCallId"])
    assert result["result"] == drizzle("stream")
    assert kinds[first_finish + 1 : first_finish + 3] == ["tool-result", "start"]
    continuation = chunks[first_finish + 2 :]
    assert continuation[-1]["payload"]["finishReason"] == "stop"
    assert continuation[0]["runId"] != chunks[0]["runId"], "the client's second call is a new run"
    assert text_of(continuation) == tool_answer(drizzle("stream"))


@pytest.mark.parametrize("call", ["generate", "stream"])
async def test_with_a_thread_the_call_is_settled_in_the_stored_turn(
    tools_output: dict[str, Any], call: str
) -> None:
    # with a thread the client sends back the tool's result (generate: and the model's answer,
    # without ids); the orchestrator settles the call it loaded from the thread
    got = tools_output[f"{call}Memory"]
    if call == "generate":
        assert got["text"] == tool_answer(drizzle("generate-memory"))
    else:
        assert text_of(got["chunks"]).endswith(tool_answer(drizzle("stream-memory")))
    assert_one_turn(got["messages"], drizzle(f"{call}-memory"))


def assert_suspended(flow: dict[str, Any]) -> None:
    kinds = [c["type"] for c in flow["chunks"]]
    assert kinds[-2:] == ["tool-call-approval", "finish"], kinds
    assert flow["chunks"][-1]["payload"]["finishReason"] == "suspended"
    assert flow["runId"] == flow["chunks"][0]["runId"]
    assert flow["toolCallId"]
    assert "tool-result" not in kinds


async def test_approve_tool_call_resumes_the_suspended_run(tools_output: dict[str, Any]) -> None:
    flow = tools_output["approve"]
    assert_suspended(flow)
    (listed,) = [r for r in flow["listedBefore"] if r["runId"] == flow["runId"]]
    assert listed["status"] == "suspended"
    assert (listed["threadId"], listed["resourceId"]) == ("th-approve", "user-ada")
    assert listed["toolCalls"] == [
        {
            "toolCallId": flow["toolCallId"],
            "toolName": "weather",
            "args": {"city": "Paris"},
            "requiresApproval": True,
        }
    ]
    resumed = flow["resumed"]
    assert {c["runId"] for c in resumed} == {flow["runId"]}
    # the resumed stream repeats the call it answers before the result, as a client expects
    assert [c["type"] for c in resumed][:3] == ["start", "tool-call", "tool-result"]
    assert resumed[2]["payload"]["result"] == {"forecast": "sunny"}
    assert resumed[-1]["payload"]["finishReason"] == "stop"
    assert text_of(resumed) == tool_answer({"forecast": "sunny"})
    assert flow["runId"] not in [r["runId"] for r in flow["listedAfter"]]
    assert flow["again"]["status"] == 409
    assert "already resumed" in flow["again"]["body"]["error"]
    assert_one_turn(flow["messages"], {"forecast": "sunny"})


async def test_decline_tool_call_tells_the_model_the_reason(tools_output: dict[str, Any]) -> None:
    flow = tools_output["decline"]
    assert_suspended(flow)
    results = [c["payload"] for c in flow["resumed"] if c["type"] == "tool-result"]
    assert results == [
        {
            "toolCallId": flow["toolCallId"],
            "toolName": "weather",
            "args": {"city": "Paris"},
            "result": "not now",
        }
    ]
    assert text_of(flow["resumed"]) == tool_answer("not now")


@pytest.mark.parametrize(("decision", "result"), [("approve", {"forecast": "sunny"}), ("decline", "not now")])
async def test_the_generate_twins_return_the_whole_run(
    tools_output: dict[str, Any], decision: str, result: Any
) -> None:
    flow = tools_output[f"{decision}Generate"]
    assert_suspended(flow)
    got = flow["result"]
    assert (got["runId"], got["status"], got["finishReason"]) == (flow["runId"], "success", "stop")
    assert got["text"] == "Let me check." + tool_answer(result)
    assert got["steps"][0]["toolResults"][0]["payload"]["result"] == result  # chunks, as the client's type
    assert tools_output["listedAtEnd"] == []
