"""Who may do what: every HTTP route and gRPC method that takes a run, a thread, an approval or a
resource, for every kind of key, exactly as docs/service.md's access table says.

One in-process `Service` per module (SQLite store, the in-memory event log, the demo and scripted
models). Keys: ``key-a`` bound to ``tenant-a``, ``key-b`` to ``tenant-b``, ``key-op`` with the
operator role, ``key-gw`` with the gateway role; ``none`` sends no key, ``bad`` an unknown one.
The objects are tenant A's: a durable run, suspended runs (one per approval that goes through), a
streaming run, a thread. For tenant B each call is made twice, on A's object and on an unknown
one, and the two answers must be identical (status and body): B learns nothing, not even that A's
exists.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr

from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.support import sse_events

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

KEYS = {"A": "key-a", "B": "key-b", "operator": "key-op", "gateway": "key-gw", "bad": "key-unknown"}
KINDS = ["A", "B", "operator", "gateway", "none", "bad"]
UNKNOWN = "0f0e0d0c-0000-4000-8000-000000000000"
Answer = tuple[str, Any]
"""What a call got: its status (an HTTP code or a gRPC code's name) and its body or details."""


def _config(db: Path) -> dict[str, Any]:
    return {
        "storage": {"backend": "sqlite", "path": str(db)},
        "durable": {"leaseSeconds": 2, "claimIntervalSeconds": 0.5},
        "models": {
            "demo": {"provider": "demo"},
            "slow": {"provider": "demo", "delayMs": 200},
            "steady": {"provider": "scripted", "responses": [{"text": "one two three"}] * 100},
        },
        "tools": {
            "weather": {"description": "Weather", "inputSchema": {"type": "object"}, "result": {"sun": 1}},
        },
        "agents": {
            "tools": {
                "model": "demo",
                "errorProcessorDefaults": False,
                "tools": ["weather"],
                "memory": {"lastMessages": 4},
            },
            "d": {"model": "steady", "durable": True, "errorProcessorDefaults": False},
            "slow": {"model": "slow", "errorProcessorDefaults": False},
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    entries = ["key-a=tenant-a", "key-b=tenant-b", "key-op=@operator", "key-gw=@gateway"]
    settings = OrchestratorSettings(
        http_port=0, grpc_port=0, api_keys=[SecretStr(e) for e in entries], health_poll_seconds=0.2
    )
    db = tmp_path_factory.mktemp("access") / "memory.db"
    async with Service(settings, parse_config(_config(db))) as svc:
        yield svc


@dataclass
class Env:
    http: httpx.AsyncClient
    stub: agrpc.AgentServiceStub
    durable_run: str
    """Tenant A's finished durable run."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(service: Service) -> AsyncIterator[Env]:
    base = f"http://127.0.0.1:{service.http_port}"
    async with (
        httpx.AsyncClient(base_url=base, timeout=30) as http,
        grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel,
    ):
        done = await http.post("/api/agents/d/generate", json={"messages": "hi"}, headers=_auth("A"))
        assert done.status_code == 200, done.text
        created = await http.post(
            "/api/memory/threads?agentId=tools", json={"threadId": "t-a"}, headers=_auth("A")
        )
        assert created.status_code == 200, created.text
        yield Env(http, agrpc.AgentServiceStub(channel), done.json()["runId"])


def _auth(kind: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[kind]}"} if kind in KEYS else {}


def _meta(kind: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {KEYS[kind]}"),) if kind in KEYS else ()


async def _answer(response: httpx.Response) -> Answer:
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = [e async for e in sse_events(response)]
        return str(response.status_code), events[-1] if events else None
    await response.aread()
    try:
        return str(response.status_code), response.json()
    except ValueError:
        return str(response.status_code), response.text


async def _send(env: Env, method: str, url: str, kind: str, body: Any = None) -> Answer:
    async with env.http.stream(method, url, json=body, headers=_auth(kind)) as response:
        return await _answer(response)


async def _grpc(call: Awaitable[Any]) -> Answer:
    try:
        reply = await call
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details()
    return "OK", reply


async def _grpc_stream(stream: Any) -> Answer:
    try:
        replies = [r async for r in stream]
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, exc.details()
    return "OK", replies[-1].status if replies else None


async def _suspended(env: Env) -> tuple[str, str]:
    """A fresh run of tenant A suspended for a tool call's approval: its id and the call's id."""
    response = await env.http.post(
        "/api/agents/tools/generate",
        json={"messages": "weather?", "requireToolApproval": True},
        headers=_auth("A"),
    )
    body = response.json()
    assert body["status"] == "suspended", body
    return body["runId"], body["suspendPayload"]["toolCallId"]


Call = Callable[[Env, str, bool], Awaitable[Answer]]
"""A route called with a kind of key, on A's object (True) or on an unknown one (False)."""


@dataclass(frozen=True)
class Case:
    name: str
    call: Call
    ok: Callable[[Env, Answer], bool]
    """Whether an answer is the access A's key and the operator's get."""


_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _masked(answer: Answer) -> tuple[str, str]:
    """An answer with the run id B sent masked (echoing what the caller sent tells it nothing)."""
    return answer[0], _ID.sub("ID", json.dumps(answer[1]) if not isinstance(answer[1], str) else answer[1])


def _http_ok(env: Env, answer: Answer) -> bool:
    return answer[0] == "200"


def _grpc_ok(env: Env, answer: Answer) -> bool:
    return answer[0] == "OK"


def _lists_a(env: Env, answer: Answer) -> bool:
    return answer[0] == "200" and env.durable_run in {r["runId"] for r in answer[1]["runs"]}


def _lists_a_grpc(env: Env, answer: Answer) -> bool:
    return answer[0] == "OK" and env.durable_run in {r.run_id for r in answer[1].runs}


def _resource(own: bool) -> str:
    return "tenant-a" if own else "tenant-zz"


def _run(env: Env, own: bool) -> str:
    return env.durable_run if own else UNKNOWN


async def _decision(env: Env, own: bool) -> dict[str, str]:
    if not own:
        return {"runId": UNKNOWN, "toolCallId": "call-x"}
    run_id, call_id = await _suspended(env)
    return {"runId": run_id, "toolCallId": call_id}


def _approval(route: str) -> Call:
    async def call(env: Env, kind: str, own: bool) -> Answer:
        return await _send(env, "POST", f"/api/agents/tools/{route}", kind, await _decision(env, own))

    return call


def _grpc_approval(approve: bool) -> Call:
    async def call(env: Env, kind: str, own: bool) -> Answer:
        d = await _decision(env, own)
        if approve:
            request: Any = apb.ApproveToolCallRequest(
                agent_id="tools", run_id=d["runId"], tool_call_id=d["toolCallId"]
            )
            return await _grpc_stream(env.stub.ApproveToolCall(request, metadata=_meta(kind), timeout=30))
        request = apb.DeclineToolCallRequest(
            agent_id="tools", run_id=d["runId"], tool_call_id=d["toolCallId"]
        )
        return await _grpc_stream(env.stub.DeclineToolCall(request, metadata=_meta(kind), timeout=30))

    return call


async def _cancel_live(env: Env, kind: str, own: bool) -> Answer:
    if not own:
        return await _send(env, "POST", f"/api/agents/slow/runs/{UNKNOWN}/cancel", kind)
    async with env.http.stream(
        "POST", "/api/agents/slow/stream", json={"messages": "hello there"}, headers=_auth("A")
    ) as response:
        events = sse_events(response)
        run_id = json.loads(await anext(events))["runId"]
        answer = await _send(env, "POST", f"/api/agents/slow/runs/{run_id}/cancel", kind)
    return answer


def _generate_body(own: bool) -> dict[str, Any]:
    return {"messages": "hi", "resourceId": _resource(own), "threadId": "t-a"}


CASES = [
    Case(
        "POST /api/agents/{id}/generate (resourceId)",
        lambda env, kind, own: _send(env, "POST", "/api/agents/tools/generate", kind, _generate_body(own)),
        _http_ok,
    ),
    Case(
        "POST /api/agents/{id}/stream (resourceId)",
        lambda env, kind, own: _send(env, "POST", "/api/agents/tools/stream", kind, _generate_body(own)),
        _http_ok,
    ),
    Case("POST approve-tool-call", _approval("approve-tool-call"), _http_ok),
    Case("POST decline-tool-call", _approval("decline-tool-call"), _http_ok),
    Case("POST approve-tool-call-generate", _approval("approve-tool-call-generate"), _http_ok),
    Case("POST decline-tool-call-generate", _approval("decline-tool-call-generate"), _http_ok),
    Case(
        "GET /api/agents/{id}/suspended-runs (resourceId)",
        lambda env, kind, own: _send(
            env, "GET", f"/api/agents/tools/suspended-runs?resourceId={_resource(own)}", kind
        ),
        _http_ok,
    ),
    Case("POST /api/agents/{id}/runs/{runId}/cancel (streaming)", _cancel_live, _http_ok),
    Case(
        "POST /api/agents/{id}/observe",
        lambda env, kind, own: _send(env, "POST", "/api/agents/d/observe", kind, {"runId": _run(env, own)}),
        _http_ok,
    ),
    Case(
        "GET /api/runs (resourceId)",
        lambda env, kind, own: _send(env, "GET", f"/api/runs?resourceId={_resource(own)}", kind),
        _lists_a,
    ),
    Case(
        "GET /api/runs/{runId}",
        lambda env, kind, own: _send(env, "GET", f"/api/runs/{_run(env, own)}", kind),
        _http_ok,
    ),
    Case(
        "POST /api/runs/{runId}/cancel",
        lambda env, kind, own: _send(env, "POST", f"/api/runs/{_run(env, own)}/cancel", kind),
        _http_ok,
    ),
    Case(
        "GET /api/memory/threads/{threadId}",
        lambda env, kind, own: _send(
            env, "GET", f"/api/memory/threads/{'t-a' if own else 't-unknown'}?resourceId=tenant-a", kind
        ),
        _http_ok,
    ),
    Case(
        "gRPC Generate (resource_id)",
        lambda env, kind, own: _grpc(
            env.stub.Generate(
                apb.GenerateRequest(agent_id="tools", text="hi", resource_id=_resource(own), thread_id="t-a"),
                metadata=_meta(kind),
                timeout=30,
            )
        ),
        _grpc_ok,
    ),
    Case(
        "gRPC Stream (resource_id)",
        lambda env, kind, own: _grpc_stream(
            env.stub.Stream(
                apb.StreamRequest(agent_id="tools", text="hi", resource_id=_resource(own), thread_id="t-a"),
                metadata=_meta(kind),
                timeout=30,
            )
        ),
        _grpc_ok,
    ),
    Case("gRPC ApproveToolCall", _grpc_approval(True), _grpc_ok),
    Case("gRPC DeclineToolCall", _grpc_approval(False), _grpc_ok),
    Case(
        "gRPC Observe",
        lambda env, kind, own: _grpc_stream(
            env.stub.Observe(apb.ObserveRequest(run_id=_run(env, own)), metadata=_meta(kind), timeout=30)
        ),
        _grpc_ok,
    ),
    Case(
        "gRPC ListRuns (resource_id)",
        lambda env, kind, own: _grpc(
            env.stub.ListRuns(
                apb.ListRunsRequest(resource_id=_resource(own)), metadata=_meta(kind), timeout=30
            )
        ),
        _lists_a_grpc,
    ),
    Case(
        "gRPC GetRun",
        lambda env, kind, own: _grpc(
            env.stub.GetRun(apb.GetRunRequest(run_id=_run(env, own)), metadata=_meta(kind), timeout=30)
        ),
        _grpc_ok,
    ),
    Case(
        "gRPC CancelRun",
        lambda env, kind, own: _grpc(
            env.stub.CancelRun(apb.CancelRunRequest(run_id=_run(env, own)), metadata=_meta(kind), timeout=30)
        ),
        _grpc_ok,
    ),
]

EXPECTED = {
    "none": {"401", "UNAUTHENTICATED"},
    "bad": {"401", "UNAUTHENTICATED"},
    "gateway": {"403", "PERMISSION_DENIED"},
}
"""The status of a kind of key that may not call these routes at all, whatever the object."""


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_each_kind_of_key_gets_exactly_the_documented_access(env: Env, case: Case, kind: str) -> None:
    answer = await case.call(env, kind, True)
    if kind in EXPECTED:
        assert answer[0] in EXPECTED[kind], answer
    elif kind in ("A", "operator"):
        assert case.ok(env, answer), answer
    else:  # tenant B: A's object answers exactly as an unknown one, and gives B nothing
        unknown = await case.call(env, kind, False)
        assert _masked(answer) == _masked(unknown)
        assert not case.ok(env, answer), answer
        assert answer[0] in ("400", "404", "INVALID_ARGUMENT", "NOT_FOUND"), answer


async def test_another_tenants_approval_answers_as_an_unknown_one_whatever_its_state(env: Env) -> None:
    """Right or wrong tool-call id, decided already or not: B gets the unknown run's answer, over
    both APIs (the run id in the words aside, which B sent)."""
    run_id, call_id = await _suspended(env)

    async def as_b(run: str, call: str) -> list[Answer]:
        decision = {"runId": run, "toolCallId": call}
        out = [await _send(env, "POST", f"/api/agents/tools/{route}", "B", decision) for route in ROUTES]
        for method, request in (
            (env.stub.ApproveToolCall, apb.ApproveToolCallRequest),
            (env.stub.DeclineToolCall, apb.DeclineToolCallRequest),
        ):
            replies = method(request(agent_id="tools", run_id=run, tool_call_id=call), metadata=_meta("B"))
            out.append(await _grpc_stream(replies))
        return [(status, json.dumps(body).replace(run, "RUN")) for status, body in out]

    unknown = await as_b(UNKNOWN, call_id)
    assert [a[0] for a in unknown] == ["404"] * 4 + ["NOT_FOUND"] * 2
    assert await as_b(run_id, call_id) == unknown  # suspended, the right tool call
    assert await as_b(run_id, "call-wrong") == unknown  # suspended, a wrong one
    decided = await _send(
        env,
        "POST",
        "/api/agents/tools/approve-tool-call-generate",
        "A",
        {"runId": run_id, "toolCallId": call_id},
    )
    assert decided[0] == "200", decided
    assert await as_b(run_id, call_id) == unknown  # already decided
    # A's own run stays A's: a second decision is a conflict on its own run
    again = await _send(
        env,
        "POST",
        "/api/agents/tools/approve-tool-call-generate",
        "A",
        {"runId": run_id, "toolCallId": call_id},
    )
    assert again[0] == "409", again


ROUTES = (
    "approve-tool-call",
    "decline-tool-call",
    "approve-tool-call-generate",
    "decline-tool-call-generate",
)


async def test_a_tenant_lists_only_its_own_runs(env: Env) -> None:
    run_id, _ = await _suspended(env)
    for kind, sees in (("A", True), ("B", False), ("operator", True)):
        runs = await _send(env, "GET", "/api/runs?perPage=100", kind)
        assert (env.durable_run in {r["runId"] for r in runs[1]["runs"]}) is sees, kind
        waiting = await _send(env, "GET", "/api/agents/tools/suspended-runs?perPage=100", kind)
        assert (run_id in {r["runId"] for r in waiting[1]["runs"]}) is sees, kind
        listed = await _grpc(
            env.stub.ListRuns(apb.ListRunsRequest(per_page=100), metadata=_meta(kind), timeout=30)
        )
        assert (env.durable_run in {r.run_id for r in listed[1].runs}) is sees, kind


async def test_only_an_operator_key_replaces_an_agents_processors_for_a_call(env: Env) -> None:
    body = {"messages": "hi", "inputProcessors": [], "outputProcessors": []}
    for kind, status in (("A", 403), ("operator", 200)):
        answer = await _send(env, "POST", "/api/agents/tools/generate", kind, body)
        assert answer[0] == str(status), answer
    refused = await _send(env, "POST", "/api/agents/tools/generate", "A", body)
    assert refused[1]["error"].startswith(
        "inputProcessors, outputProcessors: replacing an agent's processors needs an operator key"
    )


async def test_two_authorization_headers_are_refused_never_last_wins(env: Env) -> None:
    headers = [("Authorization", "Bearer key-b"), ("Authorization", "Bearer key-a")]
    response = await env.http.get(f"/api/runs/{env.durable_run}", headers=headers)
    assert response.status_code == 400
    assert response.json() == {
        "error": "the Authorization header is given more than once: send one 'Authorization: Bearer <key>'"
    }
    twice = (("authorization", "Bearer key-b"), ("authorization", "Bearer key-a"))
    code, details = await _grpc(env.stub.GetRun(apb.GetRunRequest(run_id=env.durable_run), metadata=twice))
    assert code == "UNAUTHENTICATED"
    assert details.startswith("the Authorization header is given more than once")
