"""Two `procmesh-orchestrator` replicas on one PostgreSQL database update one resource's working
memory at the same moment: none of the updates is lost (issue 29 item 1).

Ten agents share the resource's working memory (a JSON ``schema`` memory: each update is merged
into it). Each agent's scripted model (a fake OpenAI server) calls ``updateWorkingMemory`` five
times in one step, each call adding its own key; the calls of a step run concurrently, and the ten
runs go at once, five to each replica. Every update is a read-modify-write under the row's lock,
so the memory ends with all fifty keys; a lost update would drop the keys of the one it raced.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from procmesh_orchestrator.run.framework.working_memory import TOOL_NAME
from tests.e2e.memory.test_store_safety import postgres_dsn
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.memory.pg import fresh_dsn
from tests.integration.providers.fakes import FakeOpenAI

pytestmark = pytest.mark.e2e

__all__ = ["postgres_dsn"]  # the module's PostgreSQL server (tests/e2e/memory)

AGENTS = 10
CALLS = 5
DSN_ENV = "PROCMESH_WM_DSN"
AUTH = {"Authorization": "Bearer key-ada"}


@pytest.fixture(scope="module")
def model() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    fake.start()
    for i in range(AGENTS):
        updates = [
            {"id": f"c{j}", "name": TOOL_NAME, "args": {"memory": {f"k{i}-{j}": True}}} for j in range(CALLS)
        ]
        fake.script(f"k{i}", {"toolCalls": updates}, {"text": "stored"})
    yield fake
    fake.stop()


def config(model: FakeOpenAI) -> dict[str, Any]:
    memory = {"lastMessages": 5, "workingMemory": {"schema": {"type": "object"}}}
    return {
        "storage": {"backend": "postgres", "dsnEnv": DSN_ENV},
        "providers": {"fake": {"kind": "openai", "baseUrl": model.base_url}},
        "agents": {
            f"w{i}": {"model": f"fake/k{i}", "errorProcessorDefaults": False, "memory": memory}
            for i in range(AGENTS)
        },
    }


def test_two_replicas_updating_one_working_memory_lose_nothing(
    model: FakeOpenAI, postgres_dsn: str, start_orchestrator: Callable[..., OrchestratorProcess]
) -> None:
    env = {"PROCMESH_API_KEYS": "key-ada=user-ada", DSN_ENV: fresh_dsn(postgres_dsn)}
    replicas = [start_orchestrator(config(model), env=env), start_orchestrator(config(model), env=env)]

    async def run(i: int) -> dict[str, Any]:
        base = replicas[i % 2].http_url
        async with httpx.AsyncClient(base_url=base, headers=AUTH, timeout=60) as client:
            body = {"messages": f"note {i}", "memory": {"thread": f"t{i}", "resource": "user-ada"}}
            response = await client.post(f"/api/agents/w{i}/generate", json=body)
            assert response.status_code == 200, response.text
            result: dict[str, Any] = response.json()
            return result

    async def all_at_once() -> list[dict[str, Any]]:
        return await asyncio.gather(*(run(i) for i in range(AGENTS)))

    results = asyncio.run(all_at_once())
    assert [r["text"] for r in results] == ["stored"] * AGENTS
    answers = [part for r in results for part in r["toolResults"]]
    assert len(answers) == AGENTS * CALLS
    assert all(a["payload"]["result"] == {"success": True} for a in answers), answers[:3]
    got = httpx.get(
        f"{replicas[1].http_url}/api/memory/threads/t0/working-memory",
        params={"agentId": "w0", "resourceId": "user-ada"},
        headers=AUTH,
    ).json()
    stored = json.loads(got["workingMemory"])
    expected = {f"k{i}-{j}" for i in range(AGENTS) for j in range(CALLS)}
    print(f"\nworking memory: {len(stored)} of {len(expected)} concurrent updates from 2 replicas kept")
    assert set(stored) == expected
