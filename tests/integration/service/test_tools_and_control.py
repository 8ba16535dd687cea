"""Client tools, tool approval, stopWhen and run control over the HTTP and gRPC APIs.

One in-process `Service` per module (demo model, a fixed-result ``weather`` tool, SQLite store);
keys: ``key-admin`` (an operator key), ``key-ada`` bound to resource ``ada``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.support import agent_stub, http_client, sse_events, stream_chunks

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

ADMIN = {"Authorization": "Bearer key-admin"}
ADA = {"Authorization": "Bearer key-ada"}
GRPC_ADMIN = (("authorization", "Bearer key-admin"),)
CLIENT_WEATHER = {"weather": {"description": "Weather in a city", "inputSchema": {"type": "object"}}}


def _config(db: Path) -> dict[str, Any]:
    return {
        "storage": {"backend": "sqlite", "path": str(db)},
        "models": {"demo": {"provider": "demo"}, "slow": {"provider": "demo", "delayMs": 40}},
        "tools": {
            "weather": {
                "description": "Weather",
                "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
                "result": {"forecast": "sunny"},
            }
        },
        "agents": {
            "tools": {"model": "demo", "errorProcessorDefaults": False, "tools": ["weather"]},
            "plain": {"model": "demo", "errorProcessorDefaults": False},
            "slow": {"model": "slow", "errorProcessorDefaults": False},
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    keys = [SecretStr("key-admin=@operator"), SecretStr("key-ada=ada")]
    settings = OrchestratorSettings(http_port=0, grpc_port=0, api_keys=keys)
    db = tmp_path_factory.mktemp("tools") / "memory.db"
    async with Service(settings, parse_config(_config(db))) as svc:
        yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(service, ADMIN) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def stub(service: Service) -> AsyncIterator[agrpc.AgentServiceAsyncStub]:
    async with agent_stub(service) as stub:
        yield stub


async def _suspend(http: httpx.AsyncClient, headers: dict[str, str] = ADMIN) -> dict[str, Any]:
    response = await http.post(
        "/api/agents/tools/generate",
        json={"messages": "weather?", "requireToolApproval": True},
        headers=headers,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["status"] == "suspended"
    return body


# -- client tools ------------------------------------------------------------------------------


async def test_a_client_tool_call_ends_the_run_and_its_result_continues_it(http: httpx.AsyncClient) -> None:
    first = await http.post(
        "/api/agents/plain/generate",
        json={"messages": [{"role": "user", "content": "weather?"}], "clientTools": CLIENT_WEATHER},
    )
    body = first.json()
    assert (body["status"], body["finishReason"]) == ("success", "tool-calls")
    (call,) = body["toolCalls"]
    assert call["type"] == "tool-call"
    assert call["payload"]["toolName"] == "weather"
    call_id = call["payload"]["toolCallId"]
    assert body["response"]["messages"] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool-call",
                    "toolCallId": call_id,
                    "toolName": "weather",
                    "input": {"city": "Paris"},
                },
            ],
        }
    ]
    result = {"type": "tool-result", "toolCallId": call_id, "toolName": "weather", "result": {"c": 21}}
    messages = [{"role": "user", "content": "weather?"}, *body["response"]["messages"]]
    second = await http.post(
        "/api/agents/plain/generate",
        json={"messages": [*messages, {"role": "tool", "content": [result]}], "clientTools": CLIENT_WEATHER},
    )
    assert second.status_code == 200, second.text
    assert second.json()["text"] == "The tool says: {'c': 21}. That should answer it."


async def test_ui_messages_with_tool_invocations_continue_a_streamed_run(http: httpx.AsyncClient) -> None:
    ui = {
        "id": "a1",
        "role": "assistant",
        "content": "",
        "parts": [
            {"type": "step-start"},
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool-invocation",
                "toolInvocation": {"state": "call", "toolCallId": "c9", "toolName": "weather", "args": {}},
            },
        ],
    }
    output = {"type": "json", "value": "rain"}
    tool = {
        "role": "tool",
        "content": [{"type": "tool-result", "toolCallId": "c9", "toolName": "weather", "output": output}],
    }
    chunks = await stream_chunks(
        http,
        "plain",
        {"messages": [{"role": "user", "content": "weather?"}, ui, tool], "clientTools": CLIENT_WEATHER},
    )
    text = "".join(c["payload"]["text"] for c in chunks[:-1] if c["type"] == "text-delta")
    assert text == "The tool says: rain. That should answer it."


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"clientTools": {"w": "x"}}, "clientTools.w: must be an object"),
        (
            {"clientTools": {"w": {"inputSchema": {"type": 3}}}},
            "clientTools.w.inputSchema: not a valid JSON schema",
        ),
        (
            {"clientTools": {"w": {"parameters": []}}},
            "clientTools.w.parameters: must be a JSON schema object",
        ),
        ({"stopWhen": [{"stepCountIs": 0}]}, "stopWhen[0]"),
        ({"requireToolApproval": "maybe"}, "requireToolApproval"),
        (
            {"messages": [{"role": "tool", "content": [{"type": "text", "text": "x"}]}]},
            "messages.0.content.0",
        ),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool-call", "toolName": "w"}]}]},
            "messages.0.content.0: a tool call needs toolCallId",
        ),
        (
            {"messages": [{"role": "user", "parts": [{"type": "file"}]}]},
            "messages.0.parts.0: a file part needs data or url",
        ),
    ],
)
async def test_bad_tool_options_and_messages_are_400_naming_the_field(
    http: httpx.AsyncClient, body: dict[str, Any], error: str
) -> None:
    response = await http.post("/api/agents/plain/generate", json={"messages": "hi", **body})
    assert response.status_code == 400
    assert error in response.json()["error"]
    assert (await http.post("/api/agents/plain/generate", json={"messages": "hi"})).status_code == 200


async def test_stop_when_ends_the_loop_after_the_tool_call(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/api/agents/tools/generate", json={"messages": "weather?", "stopWhen": [{"hasToolCall": "weather"}]}
    )
    body = response.json()
    assert len(body["steps"]) == 1
    assert body["text"] == "Let me check."


# -- approval ------------------------------------------------------------------------------------


async def test_a_suspended_run_is_listed_approved_once_then_409(http: httpx.AsyncClient) -> None:
    body = await _suspend(http)
    assert body["finishReason"] == "suspended"
    pending = body["suspendPayload"]
    assert pending["toolName"] == "weather"
    assert body["toolCalls"][0]["payload"]["toolCallId"] == pending["toolCallId"]
    listed = (await http.get("/api/agents/tools/suspended-runs", params={"perPage": "100"})).json()
    (run,) = [r for r in listed["runs"] if r["runId"] == body["runId"]]
    assert run["status"] == "suspended"
    assert run["toolCalls"] == [
        {
            "toolCallId": pending["toolCallId"],
            "toolName": "weather",
            "args": {"city": "Paris"},
            "requiresApproval": True,
        }
    ]
    decision = {"runId": body["runId"], "toolCallId": pending["toolCallId"]}
    approved = await http.post("/api/agents/tools/approve-tool-call-generate", json=decision)
    assert approved.json()["status"] == "success"
    assert approved.json()["text"].endswith("The tool says: {'forecast': 'sunny'}. That should answer it.")
    again = await http.post("/api/agents/tools/approve-tool-call-generate", json=decision)
    assert again.status_code in (404, 409)


async def test_decline_streams_the_rest_of_the_run(http: httpx.AsyncClient) -> None:
    body = await _suspend(http)
    decision = {"runId": body["runId"], "toolCallId": body["suspendPayload"]["toolCallId"], "reason": "no"}
    chunks: list[Any] = []
    async with http.stream("POST", "/api/agents/tools/decline-tool-call", json=decision) as response:
        assert response.status_code == 200
        async for data in sse_events(response):
            chunks.append(data if data == "[DONE]" else json.loads(data))
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["type"] == "finish"
    assert {c["runId"] for c in chunks[:-1]} == {body["runId"]}


async def test_unknown_runs_are_404_and_bad_decisions_400(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        missing = await http.post(
            "/api/agents/tools/approve-tool-call", json={"runId": "nope", "toolCallId": "x"}
        )
    assert missing.status_code == 404
    assert "nope" in missing.json()["error"]
    # the caller's own mistake: its answer, not a store failure in the operator's log
    assert not [r for r in caplog.records if "store failed" in r.getMessage()]
    bad = await http.post("/api/agents/tools/approve-tool-call-generate", json={"runId": "nope"})
    assert bad.status_code == 400
    assert "toolCallId" in bad.json()["error"]
    assert (await http.get("/api/agents/tools/suspended-runs?perPage=0")).status_code == 400


async def test_a_store_that_fails_a_claim_is_logged_and_answered_without_its_text(
    service: Service, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The store failing (not the caller's mistake) is in the operator's log with the driver's
    text; the caller's answer says what happened without it."""
    body = await _suspend(http)
    decision = {"runId": body["runId"], "toolCallId": body["suspendPayload"]["toolCallId"]}
    with sqlite3.connect(service.app.config.storage.sqlite_path()) as db:
        db.execute(
            "CREATE TRIGGER refuse_claims BEFORE UPDATE ON suspended_runs "
            "BEGIN SELECT RAISE(ABORT, 'the disk says no'); END"
        )
    try:
        with caplog.at_level(logging.WARNING):
            failed = await http.post("/api/agents/tools/approve-tool-call-generate", json=decision)
    finally:
        with sqlite3.connect(service.app.config.storage.sqlite_path()) as db:
            db.execute("DROP TRIGGER refuse_claims")
    assert (failed.status_code, failed.json()) == (500, {"error": "the memory store failed"})
    (logged,) = [
        r.getMessage() for r in caplog.records if "suspended runs: the store failed" in r.getMessage()
    ]
    assert "the disk says no" in logged
    # the claim never happened: the run is still suspended, and its approval goes on
    approved = await http.post("/api/agents/tools/approve-tool-call-generate", json=decision)
    assert approved.json()["status"] == "success", approved.text


async def test_a_bound_key_sees_and_resumes_only_its_resources_runs(http: httpx.AsyncClient) -> None:
    admins = await _suspend(http)
    adas = await _suspend(http, ADA)
    listed = (await http.get("/api/agents/tools/suspended-runs", headers=ADA)).json()
    assert {r["runId"] for r in listed["runs"]} == {adas["runId"]}
    assert all(r["resourceId"] == "ada" for r in listed["runs"])
    foreign = {"runId": admins["runId"], "toolCallId": admins["suspendPayload"]["toolCallId"]}
    refused = await http.post("/api/agents/tools/approve-tool-call-generate", json=foreign, headers=ADA)
    assert refused.status_code == 404
    # the refusal left it suspended: its owner can still approve it
    assert (await http.post("/api/agents/tools/approve-tool-call-generate", json=foreign)).json()[
        "status"
    ] == "success"
    other = await http.get("/api/agents/tools/suspended-runs?resourceId=bob", headers=ADA)
    assert other.status_code == 400


async def test_concurrent_approvals_one_wins_the_other_409(http: httpx.AsyncClient) -> None:
    body = await _suspend(http)
    decision = {"runId": body["runId"], "toolCallId": body["suspendPayload"]["toolCallId"]}
    answers = await asyncio.gather(
        *(http.post("/api/agents/tools/approve-tool-call-generate", json=decision) for _ in range(2))
    )
    assert sorted(a.status_code for a in answers) == [200, 409]


# -- cancel and disconnect ---------------------------------------------------------------------------


async def _first_chunks(response: httpx.Response, n: int) -> tuple[list[dict[str, Any]], AsyncIterator[str]]:
    events = sse_events(response)
    seen = [json.loads(await anext(events)) for _ in range(n)]
    return seen, events


async def test_the_cancel_route_aborts_a_streaming_run_keeping_its_text(
    http: httpx.AsyncClient, service: Service
) -> None:
    async with http.stream("POST", "/api/agents/slow/stream", json={"messages": "hello"}) as response:
        seen, events = await _first_chunks(response, 4)
        run_id = seen[0]["payload"]["runId"]
        cancelled = await http.post(f"/api/agents/slow/runs/{run_id}/cancel")
        assert cancelled.json() == {"cancelled": True}
        rest = [json.loads(e) for e in [e async for e in events] if e != "[DONE]"]
    chunks = seen + rest
    assert chunks[-1]["type"] == "abort"
    assert any(c["type"] == "text-delta" for c in chunks)
    assert (await http.post(f"/api/agents/slow/runs/{run_id}/cancel")).status_code == 404
    assert (await http.post("/api/agents/slow/runs/nope/cancel")).status_code == 404


async def test_a_bound_key_cannot_cancel_another_resources_run(http: httpx.AsyncClient) -> None:
    async with http.stream("POST", "/api/agents/slow/stream", json={"messages": "hello"}) as response:
        seen, _ = await _first_chunks(response, 2)
        run_id = seen[0]["payload"]["runId"]
        assert (await http.post(f"/api/agents/slow/runs/{run_id}/cancel", headers=ADA)).status_code == 404
        assert (await http.post(f"/api/agents/slow/runs/{run_id}/cancel")).status_code == 200


def _aborted_runs(service: Service) -> float:
    value = service.app.metrics.registry.get_sample_value(
        "procmesh_runs_total", {"agent": "slow", "finish_reason": "abort"}
    )
    return value or 0.0


async def test_a_client_that_leaves_aborts_its_run(http: httpx.AsyncClient, service: Service) -> None:
    before = _aborted_runs(service)
    async with http.stream("POST", "/api/agents/slow/stream", json={"messages": "hello"}) as response:
        await _first_chunks(response, 4)
    for _ in range(100):
        if _aborted_runs(service) > before and service.gate.active == 0:
            break
        await asyncio.sleep(0.05)
    assert _aborted_runs(service) == before + 1
    assert len(service.runs) == 0


# -- gRPC ---------------------------------------------------------------------------------------


async def test_grpc_client_tools_and_status(stub: agrpc.AgentServiceAsyncStub) -> None:
    tool = apb.ClientTool(name="weather", description="w", input_schema=convert.to_struct({"type": "object"}))
    response = await stub.Generate(
        apb.GenerateRequest(agent_id="plain", text="weather?", client_tools=[tool]), metadata=GRPC_ADMIN
    )
    assert (response.status, response.finish_reason) == ("success", "tool-calls")
    stopped = await stub.Generate(
        apb.GenerateRequest(
            agent_id="tools", text="weather?", stop_when=[apb.StopCondition(has_tool_call="weather")]
        ),
        metadata=GRPC_ADMIN,
    )
    assert len(stopped.steps) == 1


async def test_grpc_approve_and_decline_resume_a_suspended_run(stub: agrpc.AgentServiceAsyncStub) -> None:
    suspended = await stub.Generate(
        apb.GenerateRequest(agent_id="tools", text="weather?", require_tool_approval=True),
        metadata=GRPC_ADMIN,
    )
    assert suspended.status == "suspended"
    (call,) = suspended.suspended
    request = apb.ApproveToolCallRequest(
        agent_id="tools", run_id=suspended.run_id, tool_call_id=call.tool_call_id
    )
    replies = [r async for r in stub.ApproveToolCall(request, metadata=GRPC_ADMIN)]
    assert replies[-1].status == "success"
    assert not replies[-1].HasField("chunk")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.ApproveToolCall(request, metadata=GRPC_ADMIN):
            pass
    assert info.value.code() in (grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND)
    decline = apb.DeclineToolCallRequest(agent_id="tools", run_id="nope", tool_call_id="x")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in stub.DeclineToolCall(decline, metadata=GRPC_ADMIN):
            pass
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_grpc_stream_cancellation_aborts_the_run(
    stub: agrpc.AgentServiceAsyncStub, service: Service
) -> None:
    before = _aborted_runs(service)
    call = stub.Stream(apb.StreamRequest(agent_id="slow", text="hello"), metadata=GRPC_ADMIN)
    async for reply in call:
        if reply.chunk.type == "text-delta":
            break
    call.cancel()
    for _ in range(100):
        if _aborted_runs(service) >= before + 1 and service.gate.active == 0:
            break
        await asyncio.sleep(0.05)
    assert _aborted_runs(service) == before + 1
    assert service.gate.active == 0
