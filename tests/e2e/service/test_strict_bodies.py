"""No key of a request body is ignored silently (issue: the bodies beside generate / stream's):
approve / decline (and their -generate routes), observe, the memory writes and a tool's execute
refuse a key they do not take, or one of the reference's they cannot honour, with a 400 naming it,
through a real `procmesh-orchestrator` and the real `@mastra/client-js`
(tests/clientjs/strict_bodies.mjs); the refused request changes nothing, so the same call without
the key then works. AgentService refuses a request holding fields its contract lacks the same way
(INVALID_ARGUMENT naming them)."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from google.protobuf.message import Message

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from tests.e2e.service.conftest import OrchestratorProcess, run_clientjs
from tests.e2e.service.test_clientjs import tools_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

KEY, RESOURCE = "key-ada", "user-ada"
HEADERS = {"Authorization": f"Bearer {KEY}"}
ASK = "What is the weather like?"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    start_orchestrator: Callable[..., OrchestratorProcess], tmp_path_factory: pytest.TempPathFactory
) -> OrchestratorProcess:
    config = tools_config(str(tmp_path_factory.mktemp("strict")))  # teller: `weather` needs approval
    config["tools"]["clock"] = {
        "description": "The time.",
        "inputSchema": {"type": "object"},
        "result": "noon",
    }
    config["agents"]["teller"]["tools"].append("clock")
    return await asyncio.to_thread(start_orchestrator, config, env={"PROCMESH_API_KEYS": f"{KEY}={RESOURCE}"})


@pytest_asyncio.fixture(loop_scope="module")
async def http(orchestrator: OrchestratorProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=HEADERS, timeout=30) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def seen(orchestrator: OrchestratorProcess) -> dict[str, Any]:
    out: dict[str, Any] = await asyncio.to_thread(
        run_clientjs, "strict_bodies.mjs", orchestrator, KEY, RESOURCE
    )
    return out


def refused(answer: dict[str, Any], *names: str) -> None:
    assert answer.get("status") == 400, answer
    error = str(answer["body"]["error"])
    for name in names:
        assert name in error, (name, error)


async def test_client_js_approve_with_model_is_refused_and_the_run_stays_suspended(
    seen: dict[str, Any],
) -> None:
    refused(seen["approveWithModel"], "model")
    after = seen["approveAfter"]["ok"]  # the approval the refused request did not take
    assert "tool-result" in after
    assert after[-1] == "finish"


async def test_client_js_decline_with_an_unknown_key_is_refused_then_declined(seen: dict[str, Any]) -> None:
    refused(seen["declineWithExtra"], "colour")
    assert seen["declineAfter"] == {"ok": "stop"}


async def test_client_js_observe_with_an_unknown_key_is_refused_and_replays_all(seen: dict[str, Any]) -> None:
    refused(seen["observeWithExtra"], "from")
    assert seen["observeAfter"]["ok"] == seen["durableTypes"]


async def test_client_js_memory_writes_take_its_copies_and_refuse_the_rest(seen: dict[str, Any]) -> None:
    refused(seen["createWithExtra"], "titel")
    assert seen["threadAfterRefusal"]["status"] == 404  # the refused create made no thread
    assert seen["create"] == {"ok": "Strict"}  # agentId and requestContext in the body: the query's
    refused(seen["saveWithExtra"], "format")
    assert seen["save"] == {"ok": 1}
    assert seen["messages"] == {"ok": ["m-x"]}


async def _suspended(http: httpx.AsyncClient, thread: str) -> dict[str, str]:
    body = {"messages": ASK, "memory": {"thread": thread, "resource": RESOURCE}}
    result = (await http.post("/api/agents/teller/generate", json=body)).json()
    return {"runId": result["runId"], "toolCallId": result["suspendPayload"]["toolCallId"]}


@pytest.mark.parametrize(
    ("route", "extra", "named"),
    [
        ("approve-tool-call-generate", {"reason": "why not"}, "reason"),  # only a decline has one
        ("approve-tool-call-generate", {"format": "aisdk"}, "format"),
        ("approve-tool-call", {"runtimeContext": {}}, "runtimeContext"),
        ("decline-tool-call", {"model": "demo"}, "model"),
    ],
)
async def test_a_resume_key_not_honoured_is_a_400_and_the_decision_is_still_open(
    http: httpx.AsyncClient, route: str, extra: dict[str, Any], named: str
) -> None:
    ids = await _suspended(http, f"th-{route}-{named}")
    answer = await http.post(f"/api/agents/teller/{route}", json={**ids, **extra})
    assert answer.status_code == 400, answer.text
    assert named in answer.json()["error"]
    listed = (await http.get("/api/agents/teller/suspended-runs")).json()["runs"]
    assert ids["runId"] in [r["runId"] for r in listed]  # still suspended: nothing was decided
    done = await http.post("/api/agents/teller/approve-tool-call-generate", json={**ids, "format": "mastra"})
    assert done.status_code == 200, done.text
    assert done.json()["finishReason"] == "stop"


async def test_observe_refuses_an_unknown_key(http: httpx.AsyncClient) -> None:
    answer = await http.post("/api/agents/teller/observe", json={"runId": "r-1", "fromOffset": 3})
    assert answer.status_code == 400
    assert "fromOffset" in answer.json()["error"]


async def test_thread_update_and_message_delete_refuse_unknown_keys(http: httpx.AsyncClient) -> None:
    query = {"agentId": "teller"}
    made = await http.post("/api/memory/threads", params=query, json={"threadId": "t-up", "title": "A"})
    assert made.status_code == 200, made.text
    for body, named in (({"titel": "B"}, "titel"), ({"title": 7}, "title"), ({"metadata": [1]}, "metadata")):
        answer = await http.patch("/api/memory/threads/t-up", params=query, json=body)
        assert answer.status_code == 400, (body, answer.text)
        assert named in answer.json()["error"]
    assert (await http.get("/api/memory/threads/t-up", params=query)).json()["title"] == "A"
    other = await http.post(
        "/api/memory/threads", params=query, json={"threadId": "t-up2", "agentId": "someone-else"}
    )
    assert other.status_code == 400
    assert "agentId" in other.json()["error"]
    saved = await http.post(
        "/api/memory/save-messages",
        params=query,
        json={"messages": [{"id": "m-1", "role": "user", "content": "hi", "threadId": "t-up"}]},
    )
    assert saved.status_code == 200, saved.text
    gone = await http.post(
        "/api/memory/messages/delete", params=query, json={"messageIds": ["m-1"], "threadId": "t-up"}
    )
    assert gone.status_code == 400
    assert "threadId" in gone.json()["error"]
    listed = await http.get("/api/memory/threads/t-up/messages", params=query)
    assert [m["id"] for m in listed.json()["messages"]] == ["m-1"]  # the refused delete kept it


async def test_a_tool_execute_body_takes_data_and_request_context_only(http: httpx.AsyncClient) -> None:
    answer = await http.post("/api/tools/clock/execute", json={"data": {}, "args": {}})
    assert answer.status_code == 400
    assert "args" in answer.json()["error"]
    assert (await http.post("/api/tools/clock/execute", json={"data": {}})).json() == "noon"


async def test_client_js_query_parameters_are_taken_or_refused_by_name(seen: dict[str, Any]) -> None:
    assert seen["listPartial"] == {"ok": ["helper", "keeper", "teller"]}  # requestContext, partial: taken
    refused(seen["versioned"], "versionId")  # no stored versions: not the configured agent instead
    assert seen["toolRunId"] == {"ok": "noon"}


@pytest.mark.parametrize(
    ("method", "path", "params", "named"),
    [
        ("POST", "/api/agents/teller/generate", {"stream": "true"}, "stream"),
        ("GET", "/api/agents/teller", {"requestContext": "not base64"}, "requestContext"),
        ("GET", "/api/memory/threads", {"agentId": "teller", "sort": "asc"}, "sort"),
        ("GET", "/api/runs", {"limit": "5"}, "limit"),
        ("GET", "/api/agents/teller/suspended-runs", {"pageSize": "5"}, "pageSize"),
        ("POST", "/api/tools/clock/execute", {"runId": "not a run id"}, "runId"),
    ],
)
async def test_a_query_parameter_a_route_does_not_take_is_a_400_naming_it(
    http: httpx.AsyncClient, method: str, path: str, params: dict[str, str], named: str
) -> None:
    body: dict[str, Any] | None = {"messages": "hi"} if path.endswith("generate") else None
    if method == "POST" and body is None:
        body = {"data": {}}
    answer = await http.request(method, path, params=params, json=body)
    assert answer.status_code == 400, answer.text
    assert named in answer.json()["error"]
    runs = (await http.get("/api/agents/teller/suspended-runs")).json()["total"]
    again = await http.request(
        method, path, params={k: v for k, v in params.items() if k == "agentId"}, json=body
    )
    assert again.status_code == 200, again.text  # the same request without it works
    assert (await http.get("/api/agents/teller/suspended-runs")).json()["total"] == runs


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/api/runs", "status=failed&status=completed"),
        ("/api/memory/threads", "agentId=teller&agentId=teller"),
        ("/api/agents/teller/suspended-runs", "page=0&page=1"),
    ],
)
async def test_a_query_parameter_given_twice_is_a_400_naming_it(
    http: httpx.AsyncClient, path: str, query: str
) -> None:
    # the route reads one value: the other was dropped without a word (starlette keeps the last)
    named = query.rsplit("&", 1)[1].split("=")[0]
    answer = await http.get(f"{path}?{query}")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == (
        f"query parameters given more than once: '{named}' (give each once: the route reads one value)"
    )
    once = query.rsplit("&", 1)[0]
    assert (await http.get(f"{path}?{once}")).status_code == 200  # each once: taken


async def test_a_boolean_query_parameter_other_than_true_or_false_is_a_400(http: httpx.AsyncClient) -> None:
    # includeSystemReminders=yes read as false before: the persisted signals stayed hidden, silently
    query = {"agentId": "teller"}
    made = await http.post("/api/memory/threads", params=query, json={"threadId": "t-flag"})
    assert made.status_code == 200, made.text
    path = "/api/memory/threads/t-flag/messages"
    answer = await http.get(path, params={**query, "includeSystemReminders": "yes"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "includeSystemReminders: must be true or false, got 'yes'"
    for value in ("true", "false"):
        taken = await http.get(path, params={**query, "includeSystemReminders": value})
        assert taken.status_code == 200, taken.text


async def test_a_json_key_given_twice_is_a_400_naming_it(http: httpx.AsyncClient) -> None:
    # json keeps the last of two equal keys: the first message, context or order was dropped silently
    body = b'{"messages": "first question", "messages": "second question"}'
    answer = await http.post(
        "/api/agents/teller/generate", content=body, headers={"content-type": "application/json"}
    )
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "malformed JSON body: the key 'messages' is given twice in one object"
    context = base64.b64encode(b'{"tier": "gold", "tier": "free"}').decode()
    listed = await http.get("/api/agents", params={"requestContext": context})
    assert listed.status_code == 400, listed.text
    assert listed.json()["error"] == "requestContext: the key 'tier' is given twice in one object"
    order = '{"field": "createdAt", "direction": "ASC", "direction": "DESC"}'
    made = await http.post("/api/memory/threads", params={"agentId": "teller"}, json={"threadId": "t-dup"})
    assert made.status_code == 200, made.text
    paged = await http.get(
        "/api/memory/threads/t-dup/messages", params={"agentId": "teller", "orderBy": order}
    )
    assert paged.status_code == 400, paged.text
    assert paged.json()["error"] == "orderBy: the key 'direction' is given twice in one object"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def _with_field(message: Message, number: int, value: int = 1) -> bytes:
    """`message` on the wire with a varint field `number` its contract lacks (a newer client's)."""
    wire: bytes = message.SerializeToString()
    return wire + _varint(number << 3) + _varint(value)


async def test_a_grpc_request_with_a_field_this_contract_lacks_is_invalid_argument(
    orchestrator: OrchestratorProcess,
) -> None:
    metadata = (("authorization", f"Bearer {KEY}"),)
    async with grpc.aio.insecure_channel(orchestrator.grpc_address) as channel:
        generate = channel.unary_unary(
            "/procmesh.v1.AgentService/Generate",
            request_serializer=lambda raw: raw,
            response_deserializer=apb.GenerateResponse.FromString,
        )
        request = apb.GenerateRequest(agent_id="teller", text="hi")
        nested = apb.GenerateRequest(agent_id="teller", text="hi")
        options = _with_field(apb.MemoryOptions(last_messages=3), 9)
        wire = nested.SerializeToString() + _varint((22 << 3) | 2) + _varint(len(options)) + options
        for raw, named in ((_with_field(request, 99), "field 99"), (wire, "memory_options: field 9")):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await generate(raw, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert named in (refused.value.details() or "")
        answer = await generate(request.SerializeToString(), metadata=metadata)  # without it: runs
        assert answer.finish_reason == "stop"
        stub = agrpc.AgentServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as observed:
            await channel.unary_stream(
                "/procmesh.v1.AgentService/Observe", request_serializer=lambda raw: raw
            )(_with_field(apb.ObserveRequest(run_id="r-1"), 3), metadata=metadata).read()
        assert observed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "field 3" in (observed.value.details() or "")
        listed = await stub.ListRuns(apb.ListRunsRequest(), metadata=metadata)
        assert listed.total >= 0


async def test_a_client_tools_keys_are_taken_or_warned_of_by_name(http: httpx.AsyncClient) -> None:
    # as client-js sends a createTool object: requireApproval is honoured (the call waits for a
    # decision before the client may run it), the keys procmesh does not apply are warned of
    weather = {
        "id": "weather",
        "description": "The weather where the user is.",
        "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
        "requireApproval": True,
        "outputSchema": {"type": "object"},
        "strict": True,
        "colour": "red",
    }
    before = await _ignored_counts(http)
    answer = await http.post(
        "/api/agents/helper/generate", json={"messages": ASK, "clientTools": {"weather": weather}}
    )
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert (result["status"], result["suspendPayload"]["toolName"]) == ("suspended", "weather")
    warned = {w["setting"] for w in result["warnings"]}
    assert warned == {
        "clientTools.weather.outputSchema",
        "clientTools.weather.strict",
        "clientTools.weather.colour",
    }
    after = await _ignored_counts(http)
    for label in ("clientTools.outputSchema", "clientTools.strict", "other"):
        assert after.get(label, 0) == before.get(label, 0) + 1, label
    ids = {"runId": result["runId"], "toolCallId": result["suspendPayload"]["toolCallId"]}
    resumed = (await http.post("/api/agents/helper/approve-tool-call-generate", json=ids)).json()
    assert resumed["finishReason"] == "tool-calls"  # approved: now the client runs it
    bad = await http.post(
        "/api/agents/helper/generate",
        json={"messages": ASK, "clientTools": {"weather": {**weather, "requireApproval": "yes"}}},
    )
    assert bad.status_code == 400
    assert "clientTools.weather.requireApproval" in bad.json()["error"]


async def _ignored_counts(http: httpx.AsyncClient) -> dict[str, float]:
    text = (await http.get("/metrics")).text
    found = re.findall(r'^procmesh_call_settings_ignored_total\{setting="([^"]+)"\} (\S+)$', text, re.M)
    return {label: float(value) for label, value in found}


TWICE = {"memory": {"thread": "t-a", "resource": RESOURCE}}


@pytest.mark.parametrize(
    ("given", "same", "named"),
    [
        ({"threadId": "t-b", **TWICE}, {"threadId": "t-a", **TWICE}, "threadId and memory.thread"),
        ({"resourceId": "other", **TWICE}, {"resourceId": RESOURCE, **TWICE}, "memory.resource"),
        (
            {"requestContext": {"k": "a"}, "runtimeContext": {"k": "b"}},
            {"requestContext": {}, "runtimeContext": {}},
            "requestContext and runtimeContext differ",
        ),
    ],
)
async def test_one_value_given_twice_differently_is_a_400_not_one_dropped(
    http: httpx.AsyncClient, given: dict[str, Any], same: dict[str, Any], named: str
) -> None:
    answer = await http.post("/api/agents/teller/generate", json={"messages": "hi", **given})
    assert answer.status_code == 400, answer.text
    assert named in answer.json()["error"]
    taken = await http.post("/api/agents/teller/generate", json={"messages": "hi", **same})
    assert taken.status_code == 200, taken.text  # one value, or the same under both names


async def test_client_js_generate_and_stream_take_the_mastra_format_only(seen: dict[str, Any]) -> None:
    refused(seen["generateAisdk"], "format", "aisdk")
    refused(seen["streamAisdk"], "format", "aisdk")
    assert seen["generateMastra"] == {"ok": "stop"}
    assert seen["streamMastra"]["ok"][-1] == "finish"


async def test_a_format_other_than_mastra_on_generate_or_stream_is_a_400_naming_it(
    http: httpx.AsyncClient,
) -> None:
    for route in ("generate", "stream"):
        for given in ("aisdk", 7):
            answer = await http.post(f"/api/agents/teller/{route}", json={"messages": "hi", "format": given})
            assert answer.status_code == 400, answer.text
            assert "format" in answer.json()["error"], answer.text
            assert str(given) in answer.json()["error"], answer.text
        taken = await http.post(f"/api/agents/teller/{route}", json={"messages": "hi", "format": "mastra"})
        assert taken.status_code == 200, taken.text
        assert "unsupported-setting" not in taken.text  # taken, not warned of as ignored
    answer = await http.post("/api/agents/teller/generate", json={"messages": "hi", "format": "mastra"})
    assert answer.json()["finishReason"] == "stop"
