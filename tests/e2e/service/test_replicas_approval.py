"""Tool approval across two `procmesh-orchestrator` processes sharing one PostgreSQL database.

A and B run the same config (``storage: {backend: postgres, dsnEnv: ...}``). A stream on A
suspends at a call of ``weather`` (``requireApproval``); the approval goes to B's HTTP route, and
B streams the rest of the run. The same request on A with ``requireToolApproval: false`` is the
run that never suspended: both must show the same steps, texts and tool results, and the memory
thread the turn once.

The agent answers with the demo model, not a scripted one: a scripted model's place in its
script is per process, while the demo model, like a real one, is stateless: it calls
``weather`` when the prompt asks about the weather and answers from the tool's result, so B
answers the resumed prompt as A would have.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.memory.test_store_safety import postgres_dsn
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.memory.pg import fresh_dsn
from tests.integration.service.support import sse_events

pytestmark = pytest.mark.e2e

__all__ = ["postgres_dsn"]  # the module's PostgreSQL server (tests/e2e/memory)

DSN_ENV = "PROCMESH_REPLICAS_DSN"
KEYS = "key-ada=user-ada,key-op=@operator"
AUTH = {"Authorization": "Bearer key-ada"}
OPERATOR_AUTH = {"Authorization": "Bearer key-op"}
"""An operator key: it may replace an agent's processors for a call (a tenant key may not)."""
ASK = "What is the weather like?"
SUSPENSION = ("tool-call-approval", "suspended")


def replica_config() -> dict[str, Any]:
    return {
        "storage": {"backend": "postgres", "dsnEnv": DSN_ENV},
        "models": {"demo": {"provider": "demo"}},
        "tools": {
            "weather": {
                "description": "The weather in a city.",
                "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}},
                "result": {"celsius": 21, "forecast": "sunny"},
                "requireApproval": True,
            }
        },
        "agents": {
            "teller": {
                "model": "demo",
                "errorProcessorDefaults": False,
                "tools": ["weather"],
                "memory": {"lastMessages": 20},
            }
        },
    }


def sse(base_url: str, path: str, body: dict[str, Any], auth: dict[str, str] = AUTH) -> list[dict[str, Any]]:
    """POST an SSE route and return its chunks (``[DONE]`` checked and dropped)."""

    async def read() -> list[Any]:
        async with (
            httpx.AsyncClient(base_url=base_url, headers=auth, timeout=30) as client,
            client.stream("POST", path, json=body) as response,
        ):
            assert response.status_code == 200, await response.aread()
            return [data async for data in sse_events(response)]

    events = asyncio.run(read())
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def comparable(chunks: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """A run's chunks as (type, what they carry), call ids and run ids left out, without the
    approval's own chunks (the approval request, the suspended finish, the resumed start and the
    tool-call it repeats so that its result follows its call in that stream too)."""
    out: list[tuple[str, Any]] = []
    for chunk in chunks:
        kind, payload = chunk["type"], chunk["payload"]
        if kind in SUSPENSION or payload.get("finishReason") == "suspended":
            continue
        if kind == "start" and out:
            continue  # the resumed stream's own start
        kept = {k: v for k, v in payload.items() if k not in ("toolCallId", "runId")}
        if kind == "tool-call" and (kind, kept) in out:
            continue  # repeated at the resumed stream's start
        out.append((kind, kept))
    return out


def text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")


def thread(base_url: str, thread_id: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{base_url}/api/memory/threads/{thread_id}/messages", params={"agentId": "teller"}, headers=AUTH
    )
    assert response.status_code == 200, response.text
    messages: list[dict[str, Any]] = response.json()["messages"]
    return messages


def shape(messages: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Roles and parts, call ids left out."""
    out = []
    for message in messages:
        parts = []
        for part in message["content"]["parts"]:
            if part["type"] == "tool-invocation":
                invocation = {k: v for k, v in part["toolInvocation"].items() if k != "toolCallId"}
                part = {**part, "toolInvocation": invocation}
            parts.append(part)
        out.append((message["role"], parts))
    return out


def test_a_run_suspended_on_a_is_approved_and_finished_on_b(
    postgres_dsn: str, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    env = {"PROCMESH_API_KEYS": KEYS, DSN_ENV: fresh_dsn(postgres_dsn)}
    a = start_orchestrator(replica_config(), env=env)
    b = start_orchestrator(replica_config(), env=env)
    memory = {"resource": "user-ada"}

    suspended = sse(
        a.http_url, "/api/agents/teller/stream", {"messages": ASK, "memory": {**memory, "thread": "th-1"}}
    )
    assert [c["type"] for c in suspended][-2:] == ["tool-call-approval", "finish"]
    (asked,) = [c for c in suspended if c["type"] == "tool-call-approval"]
    run_id, call_id = asked["runId"], asked["payload"]["toolCallId"]
    listed = httpx.get(f"{b.http_url}/api/agents/teller/suspended-runs", headers=AUTH).json()
    assert [r["runId"] for r in listed["runs"]] == [run_id], "B sees the run A suspended"

    decision = {"runId": run_id, "toolCallId": call_id}
    resumed = sse(b.http_url, "/api/agents/teller/approve-tool-call", decision)
    assert {c["runId"] for c in resumed} == {run_id}
    finished = f"run={run_id} finish=stop"
    assert finished in b.log(), "B finished the run"
    assert finished not in a.log()

    # the same request, never suspended
    baseline = sse(
        a.http_url,
        "/api/agents/teller/stream",
        {"messages": ASK, "memory": {**memory, "thread": "th-2"}, "requireToolApproval": False},
    )
    assert comparable(suspended + resumed) == comparable(baseline)
    assert text(suspended + resumed) == text(baseline)
    assert text(resumed) == "The tool says: {'celsius': 21, 'forecast': 'sunny'}. That should answer it."
    results = [c["payload"]["result"] for c in resumed if c["type"] == "tool-result"]
    assert results == [{"celsius": 21, "forecast": "sunny"}]

    # the thread holds the turn once, as the run that never suspended stored it
    stored = thread(b.http_url, "th-1")
    assert [m["role"] for m in stored] == ["user", "assistant", "assistant"]
    assert len({m["id"] for m in stored}) == len(stored)
    assert shape(stored) == shape(thread(a.http_url, "th-2"))
    assert httpx.get(f"{a.http_url}/api/agents/teller/suspended-runs", headers=AUTH).json()["runs"] == []

    again = httpx.post(f"{a.http_url}/api/agents/teller/approve-tool-call", json=decision, headers=AUTH)
    assert again.status_code == 409
    assert again.json()["error"].endswith(f"suspended run {run_id!r} was already resumed")
    assert "memory store" not in again.json()["error"]  # no path, host or port of the store


def guarded_config(sidecar: str | None) -> dict[str, Any]:
    """`replica_config` with the examples sidecar: the agent's output lane masks "sunny" (the
    word filter); without `sidecar`, a replica that hosts no processor at all."""
    config = replica_config()
    if sidecar is not None:
        config["sidecars"] = {"guards": {"address": sidecar}}
        masked = {"processor": "guards/word-filter", "options": {"words": ["sunny"]}}
        config["agents"]["teller"]["outputProcessors"] = [masked]
    return config


def test_a_per_call_output_list_runs_after_an_approval_on_another_replica(
    postgres_dsn: str,
    start_orchestrator: Callable[..., OrchestratorProcess],
    start_sidecar: Callable[..., SidecarProcess],
) -> None:
    sidecar = start_sidecar("examples", name="replicas-guards")
    asyncio.run(sidecar.wait_ready())
    # an operator key may replace an agent's lanes (a tenant key may not)
    env = {"PROCMESH_API_KEYS": KEYS, DSN_ENV: fresh_dsn(postgres_dsn)}
    a = start_orchestrator(guarded_config(sidecar.address), env=env)
    bare = start_orchestrator(guarded_config(None), env=env)
    b = start_orchestrator(guarded_config(sidecar.address), env=env)
    body = {"messages": ASK, "memory": {"resource": "user-ada", "thread": "th-3"}}

    # the agent's own lane masks the forecast
    plain = sse(a.http_url, "/api/agents/teller/stream", {**body, "requireToolApproval": False})
    assert "'forecast': '*****'" in text(plain)

    suspended = sse(
        a.http_url, "/api/agents/teller/stream", {**body, "outputProcessors": ["word-counter"]}, OPERATOR_AUTH
    )
    (asked,) = [c for c in suspended if c["type"] == "tool-call-approval"]
    decision = {"runId": asked["runId"], "toolCallId": asked["payload"]["toolCallId"]}

    # a replica that cannot bind the list refuses the approval, naming the entry; the run waits on
    refused = httpx.post(f"{bare.http_url}/api/agents/teller/approve-tool-call", json=decision, headers=AUTH)
    assert refused.status_code == 409, refused.text
    assert "outputProcessors.0: unknown processor 'word-counter'" in refused.json()["error"]
    listed = httpx.get(f"{b.http_url}/api/agents/teller/suspended-runs", headers=AUTH).json()
    assert [(r["runId"], r["status"]) for r in listed["runs"]] == [(decision["runId"], "suspended")]

    resumed = sse(b.http_url, "/api/agents/teller/approve-tool-call", decision)
    # the call's list ran (the counter's chunk), the agent's word filter did not (the forecast unmasked)
    assert text(resumed) == "The tool says: {'celsius': 21, 'forecast': 'sunny'}. That should answer it."
    (counted,) = [c for c in resumed if c["type"] == "data-word-count"]
    assert counted["data"]["words"] > 0  # counted per streamed chunk, split words and all
    assert f"run={decision['runId']} finish=stop" in b.log()
