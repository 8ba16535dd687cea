"""A caller's ``runId`` (issue 30 item 3): honoured by generate, stream and durable runs; refused
with 400 when malformed, 409 when another run has it (in flight here, suspended, durable; of any
resource), never a way to reach someone else's run. One in-process `Service` with two tenant
keys and a SQLite store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr

from procmesh_orchestrator.config import parse_config
from procmesh_orchestrator.service import Service
from procmesh_orchestrator.settings import OrchestratorSettings
from tests.integration.service.support import stream_chunks

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

ADA = {"Authorization": "Bearer key-ada"}
BOB = {"Authorization": "Bearer key-bob"}
WEATHER_CALL = {"toolCalls": [{"name": "weather", "args": {"city": "Paris"}}]}


def _config(db: Path) -> dict[str, Any]:
    plain = {"errorProcessorDefaults": False}
    return {
        "storage": {"backend": "sqlite", "path": str(db)},
        "models": {
            "demo": {"provider": "demo"},
            "slow": {"provider": "demo", "delayMs": 300},
            "tooler": {"provider": "scripted", "responses": [WEATHER_CALL, {"text": "sunny"}] * 20},
        },
        "tools": {
            "weather": {"description": "Weather", "inputSchema": {"type": "object"}, "result": "sunny"}
        },
        "agents": {
            "plain": {"model": "demo", **plain},
            "slow": {"model": "slow", **plain},
            "tools": {"model": "tooler", "tools": ["weather"], **plain},
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def service(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Service]:
    keys = [SecretStr("key-ada=ada"), SecretStr("key-bob=bob")]
    settings = OrchestratorSettings(http_port=0, grpc_port=0, api_keys=keys)
    db = tmp_path_factory.mktemp("run-ids") / "memory.db"
    async with Service(settings, parse_config(_config(db))) as svc:
        yield svc


@pytest_asyncio.fixture(loop_scope="module")
async def http(service: Service) -> AsyncIterator[httpx.AsyncClient]:
    url = f"http://127.0.0.1:{service.http_port}"
    async with httpx.AsyncClient(base_url=url, headers=ADA, timeout=20) as client:
        yield client


async def _generate(
    http: httpx.AsyncClient, agent: str, body: dict[str, Any], headers: dict[str, str]
) -> Any:
    return await http.post(f"/api/agents/{agent}/generate", json={"messages": "hi", **body}, headers=headers)


async def test_a_chosen_run_id_names_the_run(http: httpx.AsyncClient) -> None:
    done = await _generate(http, "plain", {"runId": "order-42:try.1"}, ADA)
    assert done.json()["runId"] == "order-42:try.1"
    chunks = await stream_chunks(http, "plain", {"messages": "hi", "runId": "order-42:try.2"})
    assert {c["runId"] for c in chunks if isinstance(c, dict)} == {"order-42:try.2"}
    # a plain run that ended leaves nothing behind: its id may be chosen again
    assert (await _generate(http, "plain", {"runId": "order-42:try.1"}, ADA)).status_code == 200


@pytest.mark.parametrize("run_id", ["", "has space", "-leading-dash", "x" * 129, "a/b", 7])
async def test_a_malformed_run_id_is_a_400_naming_it(http: httpx.AsyncClient, run_id: Any) -> None:
    response = await _generate(http, "plain", {"runId": run_id}, ADA)
    assert response.status_code == 400
    assert response.json()["error"].startswith("runId: ")


async def test_a_run_id_in_flight_is_a_409_for_anyone(http: httpx.AsyncClient) -> None:
    body = {"messages": "hi", "runId": "busy"}
    async with http.stream("POST", "/api/agents/slow/stream", json=body) as running:
        lines = running.aiter_lines()
        assert '"type":"start"' in await anext(lines)  # the run has started: it holds its id
        assert (await _generate(http, "plain", {"runId": "busy"}, BOB)).status_code == 409
        mine = await _generate(http, "plain", {"runId": "busy"}, ADA)
        assert mine.status_code == 409
        assert mine.json()["error"] == "runId 'busy' is in use by another run: choose another"
        assert "data: [DONE]" in [line async for line in lines]
    assert (await _generate(http, "plain", {"runId": "busy"}, BOB)).status_code == 200  # free again


async def test_another_resources_suspended_run_keeps_its_id_and_its_approval(http: httpx.AsyncClient) -> None:
    suspended = (
        await _generate(http, "tools", {"runId": "ada-trip", "requireToolApproval": True}, ADA)
    ).json()
    assert (suspended["status"], suspended["runId"]) == ("suspended", "ada-trip")
    # bob cannot take the id (his run would suspend over hers), nor see whose it is
    taken = await _generate(http, "tools", {"runId": "ada-trip", "requireToolApproval": True}, BOB)
    assert taken.status_code == 409
    assert "ada" not in taken.json()["error"].replace("ada-trip", "")
    call_id = suspended["suspendPayload"]["toolCallId"]
    approved = await http.post(
        "/api/agents/tools/approve-tool-call-generate",
        json={"runId": "ada-trip", "toolCallId": call_id},
        headers=ADA,
    )
    assert approved.json()["status"] == "success"
    # resumed and done: its id stays taken (a late decision on it must find that run)
    assert (await _generate(http, "plain", {"runId": "ada-trip"}, ADA)).status_code == 409


async def test_a_durable_run_takes_the_chosen_id_once(http: httpx.AsyncClient) -> None:
    body = {"messages": "hi", "runId": "durable-7", "durable": True}
    async with http.stream("POST", "/api/agents/plain/stream", json=body, headers=ADA) as response:
        assert response.headers["x-run-id"] == "durable-7"
        await response.aread()
    assert (await http.get("/api/runs/durable-7", headers=ADA)).json()["status"] == "done"
    assert (await _generate(http, "plain", {"runId": "durable-7", "durable": True}, BOB)).status_code == 409
    assert (await _generate(http, "plain", {"runId": "durable-7"}, ADA)).status_code == 409
