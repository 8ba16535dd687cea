"""Every route of every API of `@mastra/client-js` 1.47 answers against one `procmesh-orchestrator`:
what procmesh serves works, the rest is a 501 naming the feature; none is a 404 or a 500 (issue 30
item 7).

The routes are read from the client's dist: its ``route-types.generated.d.ts`` (every route of the
reference server the client types), checked to hold every path the client's code requests
(``this.request(`/...`)`` in ``index.js``). Each is called once with ids that exist here (an agent,
its tool, a processor, a workflow, a thread, the configured MCP server), so a 404 means a route,
not a resource, is missing (the memory routes too: each works or is a 501 since issue 29).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.e2e.service.conftest import CLIENTJS, OrchestratorProcess, run_clientjs
from tests.integration.service.support import API_KEY, API_KEYS

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

DIST = CLIENTJS / "node_modules" / "@mastra" / "client-js" / "dist"
NOT_SUPPORTED = " is not supported by procmesh: "
RESOURCE = "ada"
PARAMS = {
    "agentId": "helper",
    "toolId": "weather",
    "processorId": "topic-guard",
    "workflowId": "screen",
    "serverId": "calc",
    "id": "calc",
    "threadId": "t-routes",
}
"""Ids that exist in this orchestrator (any other parameter gets "x")."""
MCP_TOOL = "add"
"""The MCP server's tool (``toolId`` under /mcp)."""
UNTYPED = {"/agents/:param/browser/close", "/agents/:param/browser/session"}
"""Paths the client requests that its route types lack (test_clientjs_api.py calls their methods:
501)."""


def client_routes() -> list[tuple[str, str]]:
    """(method, path) of every route the client's route types declare, the DELETEs last (the thread
    the others use is deleted at the end)."""
    text = (DIST / "route-types.generated.d.ts").read_text(encoding="utf-8")
    routes = set(re.findall(r"^\s*'(GET|POST|PUT|PATCH|DELETE) (/[^']*)'", text, re.MULTILINE))
    return sorted(routes, key=lambda r: (r[0] == "DELETE", r[1], r[0]))


def requested_paths() -> set[str]:
    """The paths the client's code requests, as route templates (``${x}`` as ``:param``)."""
    code = (DIST / "index.js").read_text(encoding="utf-8")
    paths = set()
    for raw in re.findall(r"this\.request\(`(/[^`?]*)", code):
        segments = []
        for segment in raw.split("/")[1:]:
            if segment.startswith("${"):  # a path parameter
                segments.append(":param")
                continue
            if "${" in segment:  # a query string appended: the path ends here
                segments.append(segment.partition("${")[0])
                break
            segments.append(segment)
        paths.add("/" + "/".join(s for s in segments if s))
    return paths


def template_of(path: str) -> str:
    return re.sub(r":\w+", ":param", path)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> OrchestratorProcess:
    guards = start_sidecar("examples", "structured-output", name="routes-guards")
    await guards.wait_ready()
    server = [sys.executable, str(REPO / "tests" / "fixtures" / "mcp_server.py"), "--transport", "stdio"]
    agent = {"model": "demo", "errorProcessorDefaults": False, "memory": {"lastMessages": 10}}
    config = {
        "storage": {"backend": "sqlite", "dataDir": str(tmp_path_factory.mktemp("routes"))},
        "sidecars": {"guards": {"address": guards.address}},
        "mcpServers": {"calc": {"command": server, "cwd": str(REPO)}},
        "tools": {
            "weather": {"description": "The weather.", "inputSchema": {"type": "object"}, "result": "sunny"}
        },
        "workflows": {"screen": {"steps": ["guards/pii-redactor"]}},
        "agents": {
            "helper": {
                **agent,
                "tools": ["weather"],
                "mcpServers": ["calc"],
                "inputProcessors": [{"processor": "guards/topic-guard", "options": {"words": ["x"]}}],
            },
        },
    }
    return await asyncio.to_thread(start_orchestrator, config, env={"PROCMESH_API_KEYS": API_KEYS})


def body_for(method: str, template: str) -> dict[str, Any] | None:
    if method == "GET" or method == "DELETE":
        return None
    return {
        "messages": "hi",
        "data": {"city": "Oslo"},
        "phase": "input",
        "resourceId": RESOURCE,
        "memory": {"thread": PARAMS["threadId"], "resource": RESOURCE},
    }


async def test_the_client_lists_the_mcp_servers_and_hears_501_for_the_rest(
    orchestrator: OrchestratorProcess,
) -> None:
    got = await asyncio.to_thread(run_clientjs, "apis.mjs", orchestrator, API_KEY)
    listed = got["getMcpServers"]["ok"]
    assert ([s["id"] for s in listed["servers"]], listed["total_count"]) == (["calc"], 1)
    assert got["getMcpServerDetails"]["ok"]["name"] == "calc"
    tools = {t["name"]: t for t in got["getMcpServerTools"]["ok"]["tools"]}
    assert {"add", "lookup"} <= set(tools)
    assert tools["add"]["inputSchema"]["required"] == ["a", "b"]
    for method, feature in (
        ("listLogs", "logs"),
        ("listScorers", "scorers"),
        ("listTraces", "traces"),
        ("getTraces", "traces"),
        ("agentCard", "A2A agent cards"),
    ):
        assert got[method]["status"] == 501, (method, got[method])
        assert got[method]["body"]["error"].startswith(f"{feature}{NOT_SUPPORTED}"), got[method]


async def test_a_processor_run_without_its_required_options_is_a_400_naming_them(
    orchestrator: OrchestratorProcess,
) -> None:
    # structured-output needs its `schema`; the agent's lanes do not configure it
    body = {"phase": "outputResult", "messages": [], "agentId": "helper"}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=headers, timeout=30) as http:
        response = await http.post("/api/processors/structured-output/execute", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "structured-output" in error
    assert "schema" in error
    assert "agentId" in error


async def test_every_route_the_client_requests_is_in_its_route_types() -> None:
    typed = {template_of(p) for _, p in client_routes()}
    requested = requested_paths()
    assert len(requested) > 100
    assert {p for p in requested if template_of(p) not in typed} == UNTYPED


async def test_no_route_of_the_client_answers_404_or_500(orchestrator: OrchestratorProcess) -> None:
    routes = client_routes()
    assert len(routes) > 400
    rows: list[tuple[str, int, str]] = []
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=headers, timeout=30) as http:
        thread = {"threadId": PARAMS["threadId"], "resourceId": RESOURCE}
        created = await http.post("/api/memory/threads", params={"agentId": "helper"}, json=thread)
        assert created.status_code == 200, created.text
        ids = {**PARAMS, "threadId": created.json()["id"]}
        for method, template in routes:
            given = {**ids, "toolId": MCP_TOOL} if template.startswith("/mcp/") else ids
            path = re.sub(r":(\w+)", lambda m, given=given: given.get(m.group(1), "x"), template)
            params = {"agentId": "helper", "resourceId": RESOURCE}
            response = await http.request(
                method, f"/api{path}", params=params, json=body_for(method, template)
            )
            try:
                answer = response.json()
            except ValueError:
                answer = None
            error = str(answer.get("error", "")) if isinstance(answer, dict) else ""
            rows.append((f"{method} {template}", response.status_code, error))
    print("\n| route | answer |\n| --- | --- |")
    for route, status, error in rows:
        print(f"| `{route}` | {status} {error[:100]} |")
    broken = [r for r in rows if r[1] in (404, 405, 500)]
    assert broken == [], "\n".join(f"{r} {s} {e}" for r, s, e in broken)
    assert all(NOT_SUPPORTED in e for _, s, e in rows if s == 501)
    served = sum(1 for _, s, _ in rows if s != 501)
    print(f"{len(rows)} routes: {served} served, {len(rows) - served} answer 501")
