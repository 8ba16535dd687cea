"""A request context sent by the real `@mastra/client-js` (issue 26, Done when): on generate and
on stream, as a plain object or a `RequestContext`, it reaches the processors when the caller's API
key may send it; when it may not, the call is refused with a message naming the setting, never
run with the context silently dropped.

tests/clientjs/context.mjs calls a `procmesh-orchestrator` process with two tenant keys:
``PROCMESH_TRUSTED_CONTEXT`` lets the first send ``tenant`` and the second nothing. The agent's
only processor is the ``witness`` of tests/fixtures/tool_sidecar.py, which records the context
each of its hooks got (read back over ExecuteTool).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess, run_clientjs
from tests.e2e.tools.harness import stats

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SETTING = "PROCMESH_TRUSTED_CONTEXT"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(
    start_sidecar: Callable[..., SidecarProcess], start_orchestrator: Callable[..., OrchestratorProcess]
) -> tuple[dict[str, Any], str]:
    sidecar = start_sidecar(name="js-context", module="tests.fixtures.tool_sidecar")
    await sidecar.wait_ready()
    config = {
        "sidecars": {"py": {"address": sidecar.address}},
        "models": {"m": {"provider": "scripted", "responses": [{"text": "hi"}] * 20}},
        "agents": {
            "witnessed": {"model": "m", "errorProcessorDefaults": False, "inputProcessors": ["py/witness"]}
        },
    }
    env = {"PROCMESH_API_KEYS": "key-a=acme,key-b=globex", SETTING: json.dumps({"acme": ["tenant"]})}
    orchestrator = await asyncio.to_thread(start_orchestrator, config, env=env)
    out: dict[str, Any] = await asyncio.to_thread(run_clientjs, "context.mjs", orchestrator, "key-a", "key-b")
    return out, sidecar.address


async def contexts(address: str, run_id: str) -> list[dict[str, Any]]:
    return [h["context"] for h in (await stats(address, run_id))["run"]["seen"]]


@pytest.mark.parametrize(
    ("call", "tenant"),
    [("generate", "acme"), ("generateInstance", "globex"), ("stream", "acme"), ("streamInstance", "globex")],
)
async def test_a_trusted_callers_context_reaches_the_processors(
    run: tuple[dict[str, Any], str], call: str, tenant: str
) -> None:
    out, address = run
    assert out[call]["runId"], out[call]
    # processInput, then processInputStep of the one step
    assert await contexts(address, out[call]["runId"]) == [{"tenant": tenant}] * 2


@pytest.mark.parametrize("call", ["refusedGenerate", "refusedStream"])
async def test_an_untrusted_callers_context_is_refused_naming_the_setting(
    run: tuple[dict[str, Any], str], call: str
) -> None:
    out, _ = run
    assert out[call]["status"] == 400, out[call]
    error = out[call]["body"]["error"]
    assert "'tenant'" in error
    assert SETTING in error


async def test_the_untrusted_caller_is_served_without_a_context(run: tuple[dict[str, Any], str]) -> None:
    out, _ = run
    assert out["none"] == "success"
