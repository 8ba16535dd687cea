"""A tool that suspends itself for the caller's input (SEED-GAPS P6), across two
`procmesh-orchestrator` processes sharing one PostgreSQL database, over HTTP, gRPC and the real
`@mastra/client-js`.

The ``weather`` tool is hosted by a real SDK sidecar (`tests.fixtures.suspend_sidecar`): its first
execution suspends asking which unit; resumed with data, it answers in that unit. A stream on A
ends in the ``tool-call-suspended`` chunk; resume-stream (or gRPC ResumeToolCall) on B runs the
tool again with the data and finishes the run; a second resume is a conflict. The agents answer
with the demo model, stateless like a real one, so B answers the resumed prompt as A would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import grpc
import httpx
import pytest

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.memory.test_store_safety import postgres_dsn
from tests.e2e.service.conftest import OrchestratorProcess, run_clientjs
from tests.e2e.service.test_replicas_approval import AUTH, DSN_ENV, KEYS, sse, text
from tests.integration.memory.pg import fresh_dsn

pytestmark = pytest.mark.e2e

__all__ = ["postgres_dsn"]  # the module's PostgreSQL server (tests/e2e/memory)

ASK = "What is the weather like?"
QUESTION = {"question": "Which unit for Paris?"}
UNIT = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"]}


def suspend_config(sidecar: str) -> dict[str, Any]:
    return {
        "storage": {"backend": "postgres", "dsnEnv": DSN_ENV},
        "models": {"demo": {"provider": "demo"}},
        "sidecars": {"sus": {"address": sidecar, "timeout": 5}},
        "tools": {"weather": {"sidecar": "sus"}},
        "agents": {
            "teller": {
                "model": "demo",
                "errorProcessorDefaults": False,
                "tools": ["weather"],
                "memory": {"lastMessages": 20},
            }
        },
    }


@pytest.fixture(scope="module")
def replicas(
    postgres_dsn: str,
    start_orchestrator: Callable[..., OrchestratorProcess],
    start_sidecar: Callable[..., SidecarProcess],
) -> tuple[OrchestratorProcess, OrchestratorProcess]:
    sidecar = start_sidecar(name="suspend-tools", module="tests.fixtures.suspend_sidecar")
    asyncio.run(sidecar.wait_ready())
    env = {"PROCMESH_API_KEYS": KEYS, DSN_ENV: fresh_dsn(postgres_dsn)}
    config = suspend_config(sidecar.address)
    return start_orchestrator(config, env=env), start_orchestrator(config, env=env)


def suspend_on(a: OrchestratorProcess, thread: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Stream the question on `a` until the tool suspends: the chunks, and {runId, toolCallId}."""
    body = {"messages": ASK, "memory": {"resource": "user-ada", "thread": thread}}
    chunks = sse(a.http_url, "/api/agents/teller/stream", body)
    assert [c["type"] for c in chunks][-2:] == ["tool-call-suspended", "finish"]
    assert chunks[-1]["payload"]["finishReason"] == "suspended"
    (asked,) = [c for c in chunks if c["type"] == "tool-call-suspended"]
    payload = asked["payload"]
    assert (payload["toolName"], payload["args"], payload["suspendPayload"]) == (
        "weather",
        {"city": "Paris"},
        QUESTION,
    )
    assert json.loads(payload["resumeSchema"]) == UNIT
    assert [c for c in chunks if c["type"] == "tool-result"] == []
    return chunks, {"runId": asked["runId"], "toolCallId": payload["toolCallId"]}


def post(replica: OrchestratorProcess, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{replica.http_url}/api/agents/teller/{route}", json=body, headers=AUTH)


def test_a_run_suspended_by_its_tool_on_a_is_resumed_with_data_on_b(
    replicas: tuple[OrchestratorProcess, OrchestratorProcess],
) -> None:
    a, b = replicas
    suspended, where = suspend_on(a, "th-1")
    listed = httpx.get(f"{b.http_url}/api/agents/teller/suspended-runs", headers=AUTH).json()
    (run,) = listed["runs"]
    assert run["runId"] == where["runId"]
    (awaited,) = run["toolCalls"]
    assert (awaited["requiresApproval"], awaited["suspendPayload"]) == (False, QUESTION)

    # the wrong answers are refused by name; the run stays suspended
    approve = post(b, "approve-tool-call", where)
    assert approve.status_code == 409
    assert "suspended itself and awaits resume data, not an approval" in approve.json()["error"]
    extra = post(b, "resume-stream", {**where, "resumeData": {"unit": "celsius"}, "maxSteps": 3})
    assert extra.status_code == 400
    assert "maxSteps" in extra.json()["error"]
    missing = post(b, "resume-stream", where)
    assert missing.status_code == 400
    assert "resumeData" in missing.json()["error"]
    wrong = post(b, "resume-stream", {**where, "toolCallId": "nope", "resumeData": {"unit": "celsius"}})
    assert wrong.status_code == 404

    resumed = sse(
        b.http_url, "/api/agents/teller/resume-stream", {**where, "resumeData": {"unit": "celsius"}}
    )
    assert {c["runId"] for c in resumed} == {where["runId"]}
    result = {"city": "Paris", "unit": "celsius", "asked": QUESTION, "runs": 2}
    assert [c["payload"]["result"] for c in resumed if c["type"] == "tool-result"] == [result]
    answer = text(resumed)  # the model read the result (its keys in the wire's order)
    assert answer.startswith("The tool says: {")
    assert "'unit': 'celsius'" in answer
    assert f"run={where['runId']} finish=stop" in b.log()
    assert f"run={where['runId']} finish=stop" not in a.log()
    assert text(suspended) == "Let me check."

    again = post(a, "resume-stream", {**where, "resumeData": {"unit": "celsius"}})
    assert again.status_code == 409
    assert again.json()["error"].endswith(f"suspended run {where['runId']!r} was already resumed")

    # a run that never suspended has nothing to resume
    finished = sse(a.http_url, "/api/agents/teller/stream", {"messages": "hello"})
    never = {"runId": finished[0]["runId"], "toolCallId": where["toolCallId"], "resumeData": None}
    assert post(b, "resume-stream", never).status_code == 404


async def _resume_over_grpc(address: str, where: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agrpc.AgentServiceStub(channel)
        request = apb.ResumeToolCallRequest(
            agent_id="teller",
            run_id=where["runId"],
            tool_call_id=where["toolCallId"],
            resume_data=convert.to_value({"unit": "fahrenheit"}),
        )
        metadata = (("authorization", AUTH["Authorization"]),)
        approval = apb.ApproveToolCallRequest(
            agent_id="teller", run_id=where["runId"], tool_call_id=where["toolCallId"]
        )
        with pytest.raises(grpc.aio.AioRpcError) as mismatch:
            async for _ in stub.ApproveToolCall(approval, metadata=metadata):
                pass
        assert mismatch.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # it awaits data
        chunks, status = [], ""
        async for reply in stub.ResumeToolCall(request, metadata=metadata):
            if reply.HasField("chunk"):
                chunks.append(convert.chunk_from_proto(reply.chunk))
            else:
                status = reply.status
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.ResumeToolCall(request, metadata=metadata):
                pass
        assert refused.value.code() == grpc.StatusCode.ABORTED
        return chunks, status


def test_grpc_resume_tool_call_on_b(replicas: tuple[OrchestratorProcess, OrchestratorProcess]) -> None:
    a, b = replicas
    _, where = suspend_on(a, "th-2")
    chunks, status = asyncio.run(_resume_over_grpc(b.grpc_address, where))
    assert status == "success"
    results = [c["payload"]["result"] for c in chunks if c["type"] == "tool-result"]
    assert results == [{"city": "Paris", "unit": "fahrenheit", "asked": QUESTION, "runs": 2}]


def test_the_real_client_resumes_a_suspended_tool_on_b(
    replicas: tuple[OrchestratorProcess, OrchestratorProcess],
) -> None:
    a, b = replicas
    key = AUTH["Authorization"].removeprefix("Bearer ")
    seen = run_clientjs("suspend.mjs", a, key, b.http_url)
    (asked,) = [c for c in seen["suspended"] if c["type"] == "tool-call-suspended"]
    assert asked["payload"]["suspendPayload"] == QUESTION
    results = [c["payload"]["result"] for c in seen["resumed"] if c["type"] == "tool-result"]
    assert results == [{"city": "Paris", "unit": "fahrenheit", "asked": QUESTION, "runs": 2}]
    assert seen["resumed"][-1]["type"] == "finish"
    assert seen["again"]["status"] == 409
