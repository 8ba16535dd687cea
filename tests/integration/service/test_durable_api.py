"""Durable runs over the HTTP and gRPC APIs: streams with SSE ids, observe, runs as a resource,
readiness of the store and the event log.

One in-process `Service` per module (scripted models with ``delayMs``, SQLite store, the in-memory
event log); keys: ``key-admin`` (an operator key), ``key-ada`` bound to ``ada``, ``key-bob`` to ``bob``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh.v1 import agent_pb2_grpc as agrpc
from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.support import agent_stub, http_client

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

ADMIN = {"Authorization": "Bearer key-admin"}
ADA = {"Authorization": "Bearer key-ada"}
BOB = {"Authorization": "Bearer key-bob"}
GRPC_ADMIN = (("authorization", "Bearer key-admin"),)
GRPC_BOB = (("authorization", "Bearer key-bob"),)
WORDS = "one two three four five six seven eight nine ten"
SLOW_WORDS = " ".join(f"w{i}" for i in range(40))


def _config(db: Path) -> dict[str, Any]:
    return {
        "storage": {"backend": "sqlite", "path": str(db)},
        "durable": {"leaseSeconds": 2, "claimIntervalSeconds": 0.5},
        "models": {
            "steady": {"provider": "scripted", "delayMs": 5, "responses": [{"text": WORDS}] * 200},
            "slow": {"provider": "scripted", "delayMs": 60, "responses": [{"text": SLOW_WORDS}] * 50},
        },
        "agents": {
            "d": {"model": "steady", "durable": True, "errorProcessorDefaults": False},
            "slow": {"model": "slow", "durable": True, "errorProcessorDefaults": False},
            "plain": {"model": "steady", "errorProcessorDefaults": False},
        },
    }


def _settings() -> OrchestratorSettings:
    keys = [SecretStr("key-admin=@operator"), SecretStr("key-ada=ada"), SecretStr("key-bob=bob")]
    return OrchestratorSettings(http_port=0, grpc_port=0, api_keys=keys, health_poll_seconds=0.1)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    db = tmp_path_factory.mktemp("durable") / "memory.db"
    async with Service(_settings(), parse_config(_config(db))) as svc:
        yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with http_client(service, ADMIN) as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def stub(service: Service) -> AsyncIterator[agrpc.AgentServiceAsyncStub]:
    async with agent_stub(service) as stub:
        yield stub


Event = tuple[int | None, Any]
"""An SSE event: its id (None without one) and its data (a chunk, or the string ``[DONE]``)."""


class Sse:
    """Reads a text/event-stream response's events with their ids, a few at a time if asked; but
    the ``text-start`` / ``text-end`` framing each connection adds around its deltas (no event of
    the run's log: they carry no id)."""

    def __init__(self, response: httpx.Response) -> None:
        self._text = response.aiter_text()
        self._buffer = ""
        self._event_id: int | None = None

    async def read(self, stop_after: int | None = None) -> list[Event]:
        out: list[Event] = []
        while stop_after is None or len(out) < stop_after:
            while "\n\n" not in self._buffer:
                try:
                    self._buffer += await anext(self._text)
                except StopAsyncIteration:
                    return out
            raw, self._buffer = self._buffer.split("\n\n", 1)
            data = ""
            for line in raw.splitlines():
                if line.startswith("id: "):  # an event of its own, just before its chunk's
                    self._event_id = int(line[4:])
                elif line.startswith("data: "):
                    data = line[6:]
            if data.startswith(('{"type":"text-start"', '{"type":"text-end"')):
                assert self._event_id is None, raw
            elif data:
                out.append((self._event_id, data if data == "[DONE]" else json.loads(data)))
                self._event_id = None
        return out


async def sse(response: httpx.Response) -> list[Event]:
    """Every event of a text/event-stream response with its id."""
    return await Sse(response).read()


async def stream(
    http: httpx.AsyncClient, agent: str, body: dict[str, Any], headers: dict[str, str] = ADMIN
) -> tuple[str, list[Event]]:
    async with http.stream("POST", f"/api/agents/{agent}/stream", json=body, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        return response.headers["x-run-id"], await sse(response)


async def observe(
    http: httpx.AsyncClient,
    agent: str,
    body: dict[str, Any],
    headers: dict[str, str] = ADMIN,
) -> list[Event]:
    async with http.stream("POST", f"/api/agents/{agent}/observe", json=body, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        return await sse(response)


async def wait_status(http: httpx.AsyncClient, run_id: str, status: str) -> dict[str, Any]:
    async with asyncio.timeout(20):
        while True:
            run: dict[str, Any] = (await http.get(f"/api/runs/{run_id}")).json()
            if run["status"] == status:
                return run
            await asyncio.sleep(0.05)


def text_of(events: list[Event]) -> str:
    return "".join(
        c["payload"]["text"] for _, c in events if isinstance(c, dict) and c["type"] == "text-delta"
    )


async def test_a_durable_agents_stream_carries_sse_ids(http: httpx.AsyncClient) -> None:
    run_id, events = await stream(http, "d", {"messages": "hi"})
    assert events[-1] == (None, "[DONE]")
    chunks = events[:-1]
    assert [i for i, _ in chunks] == list(range(len(chunks)))
    assert chunks[0][1]["type"] == "start"
    assert chunks[-1][1]["type"] == "finish"
    assert all(c["runId"] == run_id and c["from"] == "AGENT" for _, c in chunks)
    assert chunks[-1][1]["payload"]["stepResult"]["reason"] == "stop"  # wire_chunk as for any stream
    assert text_of(chunks).split() == WORDS.split()
    run = await wait_status(http, run_id, "done")
    assert run["agentId"] == "d"
    assert run["attempts"] == 1
    assert run["error"] is None


async def test_observe_after_the_end_from_an_offset_gets_exactly_the_rest(http: httpx.AsyncClient) -> None:
    run_id, events = await stream(http, "d", {"messages": "hi"})
    assert await observe(http, "d", {"runId": run_id}) == events
    assert await observe(http, "d", {"runId": run_id, "offset": 5}) == events[5:]
    assert await observe(http, "d", {"runId": run_id, "offset": 10_000}) == [(None, "[DONE]")]
    # Last-Event-ID (a browser's EventSource reconnecting): the events after that id
    resumed = await observe(http, "d", {"runId": run_id}, {**ADMIN, "Last-Event-ID": "3"})
    assert resumed == events[4:]
    # an offset in the body wins over the header
    assert (
        await observe(http, "d", {"runId": run_id, "offset": 1}, {**ADMIN, "Last-Event-ID": "3"})
        == events[1:]
    )


async def test_observe_while_it_runs_gets_the_rest_live(http: httpx.AsyncClient) -> None:
    async with http.stream("POST", "/api/agents/slow/stream", json={"messages": "hi"}) as response:
        run_id = response.headers["x-run-id"]
        reader = Sse(response)
        first = await reader.read(4)
        live = asyncio.create_task(observe(http, "slow", {"runId": run_id, "offset": 2}))
        rest = await reader.read()
    observed = await live
    whole = first + rest
    assert observed == whole[2:]
    assert text_of(whole).split() == SLOW_WORDS.split()


async def test_a_client_that_leaves_does_not_cancel_a_durable_run(http: httpx.AsyncClient) -> None:
    async with http.stream("POST", "/api/agents/slow/stream", json={"messages": "hi"}) as response:
        run_id = response.headers["x-run-id"]
        seen = await Sse(response).read(3)
    # the connection is closed: the run goes on to its end
    run = await wait_status(http, run_id, "done")
    assert run["cancelRequested"] is False
    events = await observe(http, "slow", {"runId": run_id})
    assert events[:3] == seen
    assert events[-2][1]["type"] == "finish"
    assert text_of(events).split() == SLOW_WORDS.split()


@pytest.mark.parametrize("route", ["/api/runs/{run_id}/cancel", "/api/agents/slow/runs/{run_id}/cancel"])
async def test_the_cancel_routes_stop_a_durable_run(http: httpx.AsyncClient, route: str) -> None:
    async with http.stream("POST", "/api/agents/slow/stream", json={"messages": "hi"}) as response:
        run_id = response.headers["x-run-id"]
        reader = Sse(response)
        await reader.read(3)
        cancel = await http.post(route.format(run_id=run_id))
        assert cancel.status_code == 200, cancel.text
        assert cancel.json()["cancelled"] is True
        rest = await reader.read()
    assert rest[-1] == (None, "[DONE]")
    assert rest[-2][1]["type"] == "abort"
    run = await wait_status(http, run_id, "cancelled")
    assert run["cancelRequested"] is True
    # cancelling a run that ended changes nothing
    again = await http.post(f"/api/runs/{run_id}/cancel")
    assert again.json()["cancelled"] is False
    assert again.json()["run"]["status"] == "cancelled"
    assert (await http.post(f"/api/agents/slow/runs/{run_id}/cancel")).status_code == 404


async def test_per_call_durable_and_generate(http: httpx.AsyncClient) -> None:
    run_id, events = await stream(http, "plain", {"messages": "hi", "durable": True})
    assert [i for i, _ in events[:-1]] == list(range(len(events) - 1))
    assert (await wait_status(http, run_id, "done"))["agentId"] == "plain"
    # without it, the agent's stream is not durable: no ids, no run record
    async with http.stream("POST", "/api/agents/plain/stream", json={"messages": "hi"}) as response:
        assert "x-run-id" not in response.headers
        plain = await sse(response)
    assert all(i is None for i, _ in plain)
    for agent, body in (("d", {"messages": "hi"}), ("plain", {"messages": "hi", "durable": True})):
        result = await http.post(f"/api/agents/{agent}/generate", json=body)
        assert result.status_code == 200, result.text
        answer = result.json()
        assert answer["status"] == "success"
        assert answer["text"].split() == WORDS.split()
        run = (await http.get(f"/api/runs/{answer['runId']}")).json()
        assert (run["status"], run["agentId"]) == ("done", agent)
        observed = await observe(http, agent, {"runId": answer["runId"]})
        assert text_of(observed) == answer["text"]


async def test_runs_belong_to_their_resource(http: httpx.AsyncClient) -> None:
    run_id, _ = await stream(http, "d", {"messages": "hi"}, ADA)
    run = await wait_status(http, run_id, "done")
    assert run["resourceId"] == "ada"
    bobs, _ = await stream(http, "d", {"messages": "hi"}, BOB)  # a second run: paging below has two
    await wait_status(http, bobs, "done")
    mine = (await http.get("/api/runs", headers=ADA)).json()
    assert run_id in [r["runId"] for r in mine["runs"]]
    assert {r["resourceId"] for r in mine["runs"]} == {"ada"}
    assert mine["total"] == len(mine["runs"])
    theirs = (await http.get("/api/runs", headers=BOB)).json()
    assert run_id not in [r["runId"] for r in theirs["runs"]]
    # another resource's run is answered exactly like one that does not exist
    for headers, status in ((ADMIN, 200), (ADA, 200), (BOB, 404)):
        assert (await http.get(f"/api/runs/{run_id}", headers=headers)).status_code == status
    missing = await http.get("/api/runs/no-such-run", headers=BOB)
    foreign = await http.get(f"/api/runs/{run_id}", headers=BOB)
    assert missing.status_code == foreign.status_code == 404
    assert (await http.post(f"/api/runs/{run_id}/cancel", headers=BOB)).status_code == 404
    observed = await http.post("/api/agents/d/observe", json={"runId": run_id}, headers=BOB)
    assert observed.status_code == 404
    assert (await http.get("/api/runs", params={"resourceId": "ada"}, headers=BOB)).status_code == 404
    # filters and paging
    listed = (
        await http.get("/api/runs", params={"resourceId": "ada", "agentId": "d", "status": "done"})
    ).json()
    assert run_id in [r["runId"] for r in listed["runs"]]
    assert set(listed["runs"][0]) == {
        "runId",
        "agentId",
        "threadId",
        "resourceId",
        "status",
        "attempts",
        "createdAt",
        "updatedAt",
        "error",
        "cancelRequested",
    }
    page = (await http.get("/api/runs", params={"perPage": 1, "page": 0})).json()
    assert len(page["runs"]) == 1
    assert page["total"] >= 2
    assert (await http.get("/api/runs", params={"status": "cancelled", "agentId": "d"})).json()["runs"] == []


async def test_observe_refuses_unknown_runs_and_other_agents(http: httpx.AsyncClient) -> None:
    run_id, _ = await stream(http, "d", {"messages": "hi"})
    assert (await http.post("/api/agents/d/observe", json={"runId": "nope"})).status_code == 404
    assert (await http.post("/api/agents/plain/observe", json={"runId": run_id})).status_code == 404
    assert (await http.post("/api/agents/nobody/observe", json={"runId": run_id})).status_code == 404


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({}, {}),
        ([], {}),
        ({"runId": ""}, {}),
        ({"runId": 3}, {}),
        ({"runId": "r", "offset": -1}, {}),
        ({"runId": "r", "offset": "3"}, {}),
        ({"runId": "r", "offset": True}, {}),
        ({"runId": "r", "offset": 1.5}, {}),
        ({"runId": "r"}, {"Last-Event-ID": "abc"}),
        ({"runId": "r"}, {"Last-Event-ID": "-2"}),
        ({"runId": "r\x00"}, {}),
    ],
)
async def test_bad_observe_bodies_are_400(
    http: httpx.AsyncClient, body: Any, headers: dict[str, str]
) -> None:
    response = await http.post("/api/agents/d/observe", json=body, headers={**ADMIN, **headers})
    assert response.status_code == 400, response.text
    assert response.json()["error"]


@pytest.mark.parametrize(
    "params",
    [{"status": "bogus"}, {"perPage": "0"}, {"page": "-1"}, {"perPage": "x"}, {"resourceId": "a\x01"}],
)
async def test_bad_run_listings_are_400(http: httpx.AsyncClient, params: dict[str, str]) -> None:
    assert (await http.get("/api/runs", params=params)).status_code == 400


@pytest.mark.parametrize("durable", ["yes", 1, None])
async def test_a_bad_durable_option_is_400(http: httpx.AsyncClient, durable: Any) -> None:
    response = await http.post("/api/agents/plain/generate", json={"messages": "hi", "durable": durable})
    assert response.status_code == 400, response.text
    assert "durable" in response.json()["error"]


# -- gRPC ------------------------------------------------------------------------------------


async def test_grpc_stream_observe_and_runs(stub: agrpc.AgentServiceAsyncStub) -> None:
    replies = [r async for r in stub.Stream(apb.StreamRequest(agent_id="d", text="hi"), metadata=GRPC_ADMIN)]
    chunks, last = replies[:-1], replies[-1]
    assert [r.offset for r in chunks] == list(range(len(chunks)))
    assert all(r.HasField("offset") for r in chunks)
    assert not last.HasField("chunk")
    assert not last.HasField("offset")
    assert last.status == "success"
    run_id = last.run_id
    assert convert.chunk_from_proto(chunks[0].chunk)["type"] == "start"

    observed = [
        r async for r in stub.Observe(apb.ObserveRequest(run_id=run_id, offset=4), metadata=GRPC_ADMIN)
    ]
    assert [r.offset for r in observed[:-1]] == [r.offset for r in chunks[4:]]
    assert [r.chunk for r in observed[:-1]] == [r.chunk for r in chunks[4:]]
    assert observed[-1].status == "success"

    got = await stub.GetRun(apb.GetRunRequest(run_id=run_id), metadata=GRPC_ADMIN)
    assert (got.run.run_id, got.run.agent_id, got.run.status, got.run.attempts) == (run_id, "d", "done", 1)
    listed = await stub.ListRuns(apb.ListRunsRequest(agent_id="d", status="done"), metadata=GRPC_ADMIN)
    assert run_id in [r.run_id for r in listed.runs]
    assert listed.total >= 1
    cancelled = await stub.CancelRun(apb.CancelRunRequest(run_id=run_id), metadata=GRPC_ADMIN)
    assert (cancelled.cancelled, cancelled.run.status) == (False, "done")


async def test_grpc_durable_generate_and_cancel(stub: agrpc.AgentServiceAsyncStub) -> None:
    result = await stub.Generate(
        apb.GenerateRequest(agent_id="plain", text="hi", durable=True), metadata=GRPC_ADMIN
    )
    assert result.status == "success"
    assert result.text.split() == WORDS.split()
    assert (
        await stub.GetRun(apb.GetRunRequest(run_id=result.run_id), metadata=GRPC_ADMIN)
    ).run.status == "done"

    call = stub.Stream(apb.StreamRequest(agent_id="slow", text="hi"), metadata=GRPC_ADMIN)
    first = await call.read()
    assert isinstance(first, apb.StreamResponse)
    run_id = first.run_id
    cancelled = await stub.CancelRun(apb.CancelRunRequest(run_id=run_id), metadata=GRPC_ADMIN)
    assert cancelled.cancelled is True
    rest: list[apb.StreamResponse] = []
    while (reply := await call.read()) is not grpc.aio.EOF:
        assert isinstance(reply, apb.StreamResponse)
        rest.append(reply)
    assert rest[-1].status == "aborted"
    assert convert.chunk_from_proto(rest[-2].chunk)["type"] == "abort"


async def test_grpc_cancelling_a_durable_stream_leaves_the_run(stub: agrpc.AgentServiceAsyncStub) -> None:
    call = stub.Stream(apb.StreamRequest(agent_id="slow", text="hi"), metadata=GRPC_ADMIN)
    first = await call.read()
    assert isinstance(first, apb.StreamResponse)
    call.cancel()
    async with asyncio.timeout(20):
        while True:
            got = await stub.GetRun(apb.GetRunRequest(run_id=first.run_id), metadata=GRPC_ADMIN)
            if got.run.status != "running":
                break
            await asyncio.sleep(0.1)
    assert got.run.status == "done"


async def test_grpc_refusals(stub: agrpc.AgentServiceAsyncStub) -> None:
    result = await stub.Generate(apb.GenerateRequest(agent_id="d", text="hi"), metadata=GRPC_ADMIN)
    cases: list[tuple[Any, grpc.StatusCode]] = [
        (stub.GetRun(apb.GetRunRequest(run_id="nope"), metadata=GRPC_ADMIN), grpc.StatusCode.NOT_FOUND),
        (stub.GetRun(apb.GetRunRequest(run_id=result.run_id), metadata=GRPC_BOB), grpc.StatusCode.NOT_FOUND),
        (
            stub.CancelRun(apb.CancelRunRequest(run_id=result.run_id), metadata=GRPC_BOB),
            grpc.StatusCode.NOT_FOUND,
        ),
        (stub.GetRun(apb.GetRunRequest(run_id=""), metadata=GRPC_ADMIN), grpc.StatusCode.INVALID_ARGUMENT),
        (
            stub.ListRuns(apb.ListRunsRequest(status="bogus"), metadata=GRPC_ADMIN),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (stub.ListRuns(apb.ListRunsRequest(resource_id="ada"), metadata=GRPC_BOB), grpc.StatusCode.NOT_FOUND),
        (stub.ListRuns(apb.ListRunsRequest()), grpc.StatusCode.UNAUTHENTICATED),
    ]
    for pending, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pending
        assert err.value.code() == code, err.value.details()
    for request, metadata, code in (
        (apb.ObserveRequest(run_id="nope"), GRPC_ADMIN, grpc.StatusCode.NOT_FOUND),
        (apb.ObserveRequest(run_id=result.run_id), GRPC_BOB, grpc.StatusCode.NOT_FOUND),
        (apb.ObserveRequest(run_id=result.run_id, offset=-1), GRPC_ADMIN, grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.Observe(request, metadata=metadata):
                pass
        assert err.value.code() == code, err.value.details()
    bob_runs = await stub.ListRuns(apb.ListRunsRequest(), metadata=GRPC_BOB)
    assert result.run_id not in [r.run_id for r in bob_runs.runs]


# -- readiness -------------------------------------------------------------------------------


async def test_readyz_and_grpc_health_follow_the_event_log(tmp_path: Path) -> None:
    async with (
        Service(_settings(), parse_config(_config(tmp_path / "ready.db"))) as service,
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{service.http_port}", headers=ADMIN, timeout=10
        ) as http,
        grpc.aio.insecure_channel(f"127.0.0.1:{service.grpc_port}") as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)

        async def until(status: int) -> httpx.Response:
            async with asyncio.timeout(10):
                while True:
                    ready = await http.get("/readyz")
                    if ready.status_code == status:
                        return ready
                    await asyncio.sleep(0.05)

        assert (await until(200)).json()["status"] == "ready"
        assert service.app.events is not None
        await service.app.events.close()
        ready = await until(503)
        assert ready.json()["durable"] == {"eventLog": "UNREACHABLE"}
        assert "event log" in ready.json()["error"] or "eventLog" in ready.json()["error"]
        assert str(tmp_path) not in ready.text  # names what is down, never where it is
        check = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.NOT_SERVING
        refused = await http.post("/api/agents/d/generate", json={"messages": "hi"})
        assert refused.status_code == 503
        assert "event log" in refused.json()["error"]

        await service.app.events.start()
        assert (await until(200)).json()["status"] == "ready"
        check = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
