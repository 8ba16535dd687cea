"""What the real `@mastra/client-js` 1.47 reads from a generate() result and a stream, and what a
client that aborts a generate, or an approval to its end (approveToolCallGenerate), does to the run
(issue 30, items 1 and 2).

tests/clientjs/results.mjs reads every field the client's `FullOutput` type declares without
checking first (``result.warnings.length``), collects a stream's chunks, then aborts a generate of
an agent whose model (the fake OpenAI-compatible API, scripted to hold) sends one delta and never
ends: the model server must see its request cancelled, the run end as aborted and the thread keep
the turn so far, as the reference keeps it (SEED-GAPS C29): the user's input, and the delta if the
run had it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.run.messages import message_text
from tests.deps import require_npm_packages
from tests.e2e.service.conftest import CLIENTJS, NODE, OrchestratorProcess
from tests.integration.providers.fakes import FakeOpenAI
from tests.integration.service.support import API_KEY, API_KEYS

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

CANCEL_TIMEOUT = 30.0
"""Generous: the event is awaited, not timed (the test fails only if it never comes)."""


@pytest.fixture(scope="module")
def held() -> Iterator[FakeOpenAI]:
    """The model `held/m`: never finishes (a stream gets the role's event and the delta "Thinking",
    a whole answer its head), nothing more until its reader goes away."""
    model = FakeOpenAI().start()
    model.script("m", {"text": "Thinking", "holdAfter": 2})
    yield model
    model.stop()


@pytest.fixture(scope="module")
def vaulter() -> Iterator[FakeOpenAI]:
    """The model `vaulter/m`: calls the tool `vault` (which needs approval), then, resumed, never
    finishes as `held/m` does."""
    model = FakeOpenAI().start()
    vault = {"id": "call-vault", "name": "vault", "args": {}}
    model.script("m", {"toolCalls": [vault]}, {"text": "Opening", "holdAfter": 2})
    yield model
    model.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    held: FakeOpenAI,
    vaulter: FakeOpenAI,
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> OrchestratorProcess:
    agent = {"errorProcessorDefaults": False, "memory": {"lastMessages": 10}}
    config = {
        "storage": {"backend": "sqlite", "dataDir": str(tmp_path_factory.mktemp("results"))},
        "providers": {
            "held": {"kind": "openai", "baseUrl": held.base_url},
            "vaulter": {"kind": "openai", "baseUrl": vaulter.base_url},
        },
        "tools": {"vault": {"description": "Opens the vault.", "result": "open", "requireApproval": True}},
        "agents": {
            "assistant": {**agent, "model": "demo"},
            "held": {**agent, "model": "held/m"},
            "vaulted": {**agent, "model": "vaulter/m", "tools": ["vault"]},
        },
    }
    return await asyncio.to_thread(start_orchestrator, config, env={"PROCMESH_API_KEYS": API_KEYS})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def script(orchestrator: OrchestratorProcess, held: FakeOpenAI, vaulter: FakeOpenAI) -> dict[str, Any]:
    """results.mjs run to its end: its printed objects, merged; and whether the model servers saw
    the aborted generate's and the aborted approval's calls cancelled."""
    require_npm_packages(CLIENTJS)
    proc = await asyncio.create_subprocess_exec(
        str(NODE),
        "results.mjs",
        orchestrator.http_url,
        API_KEY,
        cwd=CLIENTJS,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    first = await proc.stdout.readline()
    if not first:  # the script failed: its error, and the orchestrator's side
        assert proc.stderr is not None
        raise AssertionError((await proc.stderr.read()).decode() + orchestrator.log())
    out: dict[str, Any] = json.loads(first)
    for model, cancelled in ((held, "modelCancelled"), (vaulter, "approvalCancelled")):
        assert json.loads(await proc.stdout.readline()) == {"asked": True}
        assert await asyncio.to_thread(model.held.wait, CANCEL_TIMEOUT), f"{cancelled}: never called"
        loop = asyncio.get_running_loop()
        proc.stdin.write(b"abort\n")
        await proc.stdin.drain()
        aborted_at = loop.time()
        out[cancelled] = await asyncio.to_thread(model.released.wait, CANCEL_TIMEOUT)
        print(f"\n{cancelled}: the model server saw it {loop.time() - aborted_at:.3f}s after the abort")
    stdout, stderr = await proc.communicate()
    assert proc.returncode == 0, stderr.decode() + orchestrator.log()
    out.update(json.loads(stdout))
    return out


async def test_a_result_has_every_field_the_clients_type_declares(script: dict[str, Any]) -> None:
    assert script["fields"] == {
        "warnings": 0,
        "sources": 0,
        "files": 0,
        "reasoning": 0,
        "usedFallbackValue": False,
        "stepWarnings": 0,
        "stepSources": 0,
    }
    generated = script["generated"]
    for key in ("providerMetadata", "request", "reasoningText", "tripwire", "suspendPayload", "spanId"):
        assert key in generated, key
    (step,) = generated["steps"]
    assert step["content"] == [{"type": "text", "text": generated["text"]}]
    assert (step["staticToolCalls"], step["dynamicToolCalls"], step["files"]) == ([], [], [])


@pytest.mark.parametrize("stream", ["chunks", "durable"])
async def test_a_streams_text_is_framed_by_text_start_and_text_end(
    script: dict[str, Any], stream: str
) -> None:
    types = [c["type"] for c in script[stream]]
    first, last = types.index("text-delta"), len(types) - 1 - types[::-1].index("text-delta")
    assert types[first - 1] == "text-start"
    assert types[last + 1] == "text-end"
    assert set(types[first : last + 1]) == {"text-delta"}
    assert types.count("text-start") == types.count("text-end") == 1
    ids = {c["payload"]["id"] for c in script[stream] if c["type"].startswith("text-")}
    assert len(ids) == 1
    assert types.index("text-end") < types.index("step-finish")


async def aborted_run(orchestrator: OrchestratorProcess, agent: str, thread: str) -> list[dict[str, Any]]:
    """The messages `thread` of `agent` keeps, once the agent's one run has ended as aborted."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=headers, timeout=10) as http:
        metrics = (await http.get("/metrics")).text
        saved = await http.get(
            f"/api/memory/threads/{thread}/messages", params={"agentId": agent, "resourceId": "ada"}
        )
    assert f'procmesh_runs_total{{agent="{agent}",finish_reason="abort"}} 1.0' in metrics
    messages: list[dict[str, Any]] = saved.json()["messages"]
    return messages


async def test_an_aborted_generate_stops_its_model_call_and_saves_the_turn_so_far(
    script: dict[str, Any], orchestrator: OrchestratorProcess
) -> None:
    assert script["aborted"] == "AbortError"
    assert script["modelCancelled"], "the model server never saw its call cancelled"
    turn = [(m["role"], message_text(m)) for m in await aborted_run(orchestrator, "held", "t-abort")]
    assert turn[0] == ("user", "go"), turn
    assert turn[1:] in ([], [("assistant", "Thinking")]), turn


async def test_an_aborted_approval_to_its_end_stops_its_model_call_as_a_generate_does(
    script: dict[str, Any], orchestrator: OrchestratorProcess
) -> None:
    """approveToolCallGenerate aborted by its client: as a generate (SEED-GAPS C29)."""
    assert script["approveAborted"] == "AbortError"
    assert script["approvalCancelled"], "the model server never saw the resumed run's call cancelled"
    # the turn so far: the input and the approved call's result (the resumed answer sent nothing)
    messages = await aborted_run(orchestrator, "vaulted", "t-approve-abort")
    assert [(m["role"], message_text(m)) for m in messages] == [("user", "open it"), ("assistant", "")]
    (part,) = messages[1]["content"]["parts"]
    assert (part["toolInvocation"]["state"], part["toolInvocation"]["result"]) == ("result", "open")
