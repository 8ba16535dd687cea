"""Every client method of `@mastra/client-js` 1.47's agent, tool, processor, workflow-listing and
provider APIs, through the real client against one `procmesh-orchestrator` process.

tests/clientjs/methods.mjs calls each method once as a user would (``methods``) and some of them
again on other input (``probes``: errors, each processor phase), against sidecars from ``python
-m procmesh_sidecars examples`` and `redactor_sidecar`. The tests check the shapes the client
relies on (``Object.keys(details.tools)``, superjson schema strings, chunks with ``runId``) and
that what procmesh cannot support answers 501 naming the feature. `test_every_method_works_or_
answers_501` prints the table of every method and its result (docs/service.md has it). A route
test walks every route of those APIs in the client's ``route-types.generated.d.ts``: none
answers 404.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import CLIENTJS, OrchestratorProcess, run_clientjs
from tests.integration.service.support import API_KEY, API_KEYS, demo_answer

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

ROUTE_TYPES = CLIENTJS / "node_modules" / "@mastra" / "client-js" / "dist" / "route-types.generated.d.ts"
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
PREFIXES = (
    "/agents",
    "/tools",
    "/processors",
    "/workflows",
    "/tool-providers",
    "/processor-providers",
    "/stored/agents/:agentId/versions",
)
"""The client APIs this covers: agents (their versions too), tools, processors, workflows,
providers (of models, tools and processors)."""


def api_config(guards: str, redactor: str, data_dir: str) -> dict[str, Any]:
    agent = {"model": "demo", "errorProcessorDefaults": False}
    return {
        "storage": {"backend": "sqlite", "dataDir": data_dir},  # suspended and durable runs
        "sidecars": {"guards": {"address": guards}, "redactor": {"address": redactor}},
        "models": {"demo": {"provider": "demo"}, "slow": {"provider": "demo", "delayMs": 150}},
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
            "helper": {**agent, "tools": ["weather", "vault"]},
            "screened": {**agent, "inputProcessors": ["workflow:screen"]},
            "concise": {
                **agent,
                "outputProcessors": [{"processor": "guards/length-check", "options": {"max_words": 12}}],
            },
            "remote": {**agent, "model": "openai/gpt-4o-mini"},
            "slow": {**agent, "model": "slow"},
        },
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> OrchestratorProcess:
    guards = start_sidecar("examples", name="api-guards")
    redactor = start_sidecar(name="api-redactor", module="tests.e2e.service.redactor_sidecar")
    await asyncio.gather(guards.wait_ready(), redactor.wait_ready())
    config = api_config(guards.address, redactor.address, str(tmp_path_factory.mktemp("api-store")))
    # heartbeats every 50 ms: the slow agent's 150 ms between deltas get some (the client skips them)
    env = {"PROCMESH_API_KEYS": API_KEYS, "PROCMESH_SSE_HEARTBEAT_SECONDS": "0.05"}
    return await asyncio.to_thread(start_orchestrator, config, env=env)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def out(orchestrator: OrchestratorProcess) -> dict[str, Any]:
    output: dict[str, Any] = await asyncio.to_thread(run_clientjs, "methods.mjs", orchestrator, API_KEY)
    return output


def ok(got: dict[str, Any], name: str) -> Any:
    assert "ok" in got[name], (name, got[name])
    return got[name]["ok"]


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")


# -- what the client relies on, method by method ------------------------------------------------


async def test_details_has_every_field_the_client_reads(out: dict[str, Any]) -> None:
    methods, probes = out["methods"], out["probes"]
    details = ok(methods, "agent.details")
    assert ok(probes, "detailsToolKeys") == ["weather", "vault"]
    assert details["tools"]["weather"]["id"] == "weather"
    assert json.loads(details["tools"]["weather"]["inputSchema"]) == {"json": WEATHER_SCHEMA}
    assert details["tools"]["vault"]["requireApproval"] is True
    assert (details["provider"], details["modelId"]) == ("demo", "demo")
    for key, empty in (
        ("agents", {}),
        ("workflows", {}),
        ("skills", []),
        ("inputProcessors", []),
        ("outputProcessors", []),
    ):
        assert details[key] == empty
    assistant = ok(probes, "assistantDetails")
    assert assistant["instructions"] == "You are helpful."
    assert assistant["inputProcessors"] == [{"id": "topic-guard", "name": "guards/topic-guard"}]
    assert assistant["outputProcessors"] == [{"id": "word-filter", "name": "guards/word-filter"}]
    listed = ok(methods, "listAgents")
    assert sorted(listed) == ["assistant", "concise", "helper", "remote", "screened", "slow"]
    assert listed["helper"] == details
    assert listed["screened"]["inputProcessors"] == [{"id": "screen", "name": "workflow:screen"}]
    assert (listed["remote"]["provider"], listed["remote"]["modelId"]) == ("openai", "gpt-4o-mini")


async def test_generate_and_stream_answer_with_the_references_shapes(out: dict[str, Any]) -> None:
    methods = out["methods"]
    answer = demo_answer("hello").replace("Darn", "****")
    generated = ok(methods, "agent.generate")
    assert (generated["status"], generated["finishReason"], generated["text"]) == ("success", "stop", answer)
    assert generated["totalUsage"]["totalTokens"] > 0
    assert (generated["toolCalls"], generated["toolResults"], generated["violations"]) == ([], [], [])
    assert [m["role"] for m in generated["messages"]] == ["assistant"]
    chunks = ok(methods, "agent.stream")
    assert (chunks[0]["type"], chunks[-1]["type"]) == ("start", "finish")
    assert {(c["runId"], c["from"]) for c in chunks} == {(chunks[0]["runId"], "AGENT")}
    assert text_of(chunks) == answer


async def test_per_call_processors_run_for_an_operator_key(out: dict[str, Any]) -> None:
    # this module's key is an operator's; a tenant key's list is a 403 (test_access.py)
    ran = out["probes"]["perCallProcessors"]
    assert ran["ok"]["status"] == "success", ran


async def test_tools_are_listed_and_executed_through_the_tool_path(out: dict[str, Any]) -> None:
    methods, probes = out["methods"], out["probes"]
    assert ok(methods, "agent.getTool") == ok(methods, "agent.details")["tools"]["weather"]
    assert probes["getToolMissing"]["status"] == 404
    assert ok(methods, "agent.executeTool") == "sunny"
    assert ok(methods, "getTool(id).execute") == "sunny"
    bad = probes["executeToolBadArgs"]
    assert bad["status"] == 400
    assert "Tool input validation failed for weather" in bad["body"]["error"]
    assert probes["executeToolNeedsApproval"]["status"] == 409
    assert (
        "requires approval, which a direct execution would bypass"
        in probes["executeToolNeedsApproval"]["body"]["error"]
    )
    assert sorted(ok(methods, "listTools")) == ["vault", "weather"]
    assert ok(methods, "getTool(id).details") == ok(methods, "agent.getTool")


def tool_answer(result: Any) -> str:
    """What the demo model answers once a tool returned `result`."""
    return f"The tool says: {result}. That should answer it."


async def test_tool_calls_awaiting_approval_are_listed_approved_and_declined(out: dict[str, Any]) -> None:
    methods, probes = out["methods"], out["probes"]
    listed = ok(methods, "agent.listSuspendedRuns")
    (run,) = [r for r in listed["runs"] if r["runId"] == probes["suspendedRunId"]]
    assert (run["status"], run["toolCalls"][0]["toolName"]) == ("suspended", "weather")
    approved = ok(methods, "agent.approveToolCall")
    assert [c["type"] for c in approved][:3] == ["start", "tool-call", "tool-result"]
    assert text_of(approved) == tool_answer("sunny")
    declined = ok(methods, "agent.declineToolCall")
    assert [c["payload"]["result"] for c in declined if c["type"] == "tool-result"] == ["not now"]
    assert probes["suspendedGenerate"]["status"] == "suspended"
    done = ok(methods, "agent.approveToolCallGenerate")
    assert (done["status"], done["text"]) == ("success", "Let me check." + tool_answer("sunny"))
    assert [c["payload"]["toolName"] for c in done["toolCalls"]] == ["weather"]
    assert [c["payload"]["result"] for c in done["toolResults"]] == ["sunny"]
    assert probes["approveAgain"]["status"] == 409
    refused = ok(methods, "agent.declineToolCallGenerate")
    assert refused["text"] == "Let me check." + tool_answer("not now")
    resumed = ok(methods, "agent.resumeStream")  # resumeData {approved: true}: the approval
    assert text_of(resumed) == tool_answer("sunny")


async def test_a_durable_run_is_observed_again_with_the_same_chunks(out: dict[str, Any]) -> None:
    streamed = out["probes"]["durableStream"]
    observed = ok(out["methods"], "agent.observe")
    assert [c["type"] for c in observed] == [c["type"] for c in streamed]
    assert text_of(observed) == text_of(streamed) == demo_answer("hello").replace("Darn", "****")


async def test_processors_come_from_describe(out: dict[str, Any]) -> None:
    methods = out["methods"]
    listed = ok(methods, "listProcessors")
    assert {"topic-guard", "pii-redactor", "word-filter", "result-redactor", "screen"} <= set(listed)
    guard = listed["topic-guard"]
    assert guard["phases"] == ["input"]
    assert guard["agentIds"] == ["assistant", "screened"]
    assert {"agentId": "assistant", "type": "input"} in guard["configurations"]
    assert guard["isWorkflow"] is False
    assert listed["word-filter"]["phases"] == ["outputStream"]
    assert listed["result-redactor"]["phases"] == ["toolResult"]
    assert listed["screen"]["isWorkflow"] is True
    assert listed["screen"]["configurations"] == [{"agentId": "screened", "type": "input"}]
    details = ok(methods, "getProcessor(id).details")
    assert details["description"] == "Aborts when the user input contains a blocked word."
    assert {"agentId": "screened", "agentName": "screened", "type": "input"} in details["configurations"]


def first_text(answer: dict[str, Any], index: int = 0) -> str:
    text: str = answer["messageList"]["messages"][index]["content"]["parts"][0]["text"]
    return text


async def test_a_processor_runs_one_phase_on_given_messages(out: dict[str, Any]) -> None:
    methods, probes = out["methods"], out["probes"]
    passed = ok(methods, "getProcessor(id).execute")
    assert (passed["success"], passed["phase"]) == (True, "input")
    assert first_text(passed) == "hello"
    tripped = ok(probes, "executeTripwire")
    assert (tripped["success"], tripped["tripwire"]["triggered"]) == (False, True)
    assert tripped["tripwire"]["reason"] == "Blocked: the request mentions 'jailbreak'"
    assert tripped["tripwire"]["metadata"]["processorId"] == "topic-guard"
    assert first_text(ok(probes, "executeRewrite")) == "mail [email]"
    # the agent's options for it: length-check with max_words 12 asks for a shorter answer
    step = ok(probes, "executeOutputStep")
    assert (step["success"], step["tripwire"]["reason"]) == (False, "Answer in at most 12 words.")
    assert probes["executeWrongPhase"]["status"] == 400
    assert "has no outputStream phase" in probes["executeWrongPhase"]["body"]["error"]
    workflow = ok(probes, "executeWorkflow")  # pii-redactor, then topic-guard and word-counter
    assert (workflow["success"], first_text(workflow)) == (True, "hi")


async def test_the_output_stream_phase_runs_the_assistant_text_through_the_session(
    out: dict[str, Any],
) -> None:
    probes = out["probes"]
    streamed = ok(probes, "executeOutputStream")
    assert (streamed["success"], streamed["phase"]) == (True, "outputStream")
    assert [first_text(streamed, i) for i in (0, 1)] == ["x", "**** it"]  # the user's stays as it was
    assert probes["executeOutputStreamNoText"]["status"] == 400
    assert "give one" in probes["executeOutputStreamNoText"]["body"]["error"]


async def test_the_tool_result_phase_rewrites_the_result_in_its_part(out: dict[str, Any]) -> None:
    redacted = ok(out["probes"], "executeToolResult")
    assert (redacted["success"], redacted["phase"]) == (True, "toolResult")
    (part,) = redacted["messages"][0]["content"]["parts"]
    assert part["toolInvocation"]["result"] == {"door": "open", "secret": "[redacted]"}


async def test_processor_workflows_are_listed(out: dict[str, Any]) -> None:
    methods = out["methods"]
    workflows = ok(methods, "listWorkflows")
    assert list(workflows) == ["screen"]
    screen = ok(methods, "getWorkflow(id).details")
    assert screen == workflows["screen"]
    assert screen["isProcessorWorkflow"] is True
    assert sorted(screen["steps"]) == ["pii-redactor", "topic-guard", "word-counter"]
    assert [s["type"] for s in screen["stepGraph"]] == ["step", "parallel"]
    assert ok(methods, "getWorkflow(id).getSchema") == {"inputSchema": None, "outputSchema": None}


async def test_model_providers_list_the_configured_ones(out: dict[str, Any]) -> None:
    providers = {p["id"]: p for p in ok(out["methods"], "listAgentsModelProviders")["providers"]}
    assert providers["openai"]["models"] == ["gpt-4o-mini"]
    assert providers["openai"]["envVar"] == "OPENAI_API_KEY"
    assert providers["anthropic"]["models"] == []
    assert providers["demo"] == {
        "id": "demo",
        "name": "demo",
        "label": "procmesh built-in demo model",
        "envVar": [],
        "connected": True,
        "models": ["demo", "slow"],
    }


async def lines_of(response: httpx.Response) -> list[str]:
    assert response.status_code == 200
    return [line async for line in response.aiter_lines() if line]


async def observed_lines(http: httpx.AsyncClient, run_id: str, offset: int) -> list[str]:
    body = {"runId": run_id, "offset": offset}
    async with http.stream("POST", "/api/agents/slow/observe", json=body) as response:
        return await lines_of(response)


@pytest.mark.parametrize("durable", [False, True])
async def test_a_silent_stream_sends_heartbeats_durable_or_not(
    orchestrator: OrchestratorProcess, durable: bool
) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=headers, timeout=20) as http:
        body = {"messages": "hi", "durable": durable}
        async with http.stream("POST", "/api/agents/slow/stream", json=body) as response:
            if durable:  # observed again from its third event while it runs: a live stream too
                observing = asyncio.ensure_future(observed_lines(http, response.headers["x-run-id"], 2))
            streams = [await lines_of(response)]
        if durable:
            streams.append(await observing)
    for lines in streams:
        deltas = [i for i, line in enumerate(lines) if '"text-delta"' in line]
        assert ": ping" in lines[deltas[0] : deltas[-1]], lines
        # every id line comes just before its chunk's data line, heartbeats between events only
        ids = [i for i, line in enumerate(lines) if line.startswith("id: ")]
        assert (len(ids) > 2) is durable
        assert all(lines[i + 1].startswith("data: {") for i in ids)
        assert lines[-1] == "data: [DONE]"
    if durable:
        # the first event's id: the observed stream starts mid-text, with its text-start (no id)
        assert [int(next(x for x in lines if x.startswith("id: "))[4:]) for lines in streams] == [0, 2]
        assert streams[1][0].startswith('data: {"type":"text-start"')


# -- the table: every method works or answers 501 ------------------------------------------------

NOT_SUPPORTED = " is not supported by procmesh: "


def table(methods: dict[str, Any]) -> list[tuple[str, str]]:
    """(method, "works" or "501: <reason>") for each client method, in the script's order."""
    rows = []
    for name, got in methods.items():
        if "ok" in got:
            rows.append((name, "works"))
        else:
            error = got["body"]["error"] if isinstance(got.get("body"), dict) else got.get("body")
            rows.append((name, f"{got.get('status')}: {error}"))
    return rows


async def test_every_method_works_or_answers_501(out: dict[str, Any]) -> None:
    rows = table(out["methods"])
    print("\n| client method | result |\n| --- | --- |")
    for name, result in rows:
        print(f"| `{name}` | {result} |")
    failed = [(n, r) for n, r in rows if r != "works" and not (r.startswith("501: ") and NOT_SUPPORTED in r)]
    assert not failed, failed
    works = {n for n, r in rows if r == "works"}
    assert (len(rows), len(works)) == (77, 23)
    assert out["methods"]["getWorkflow(id).createRun"]["body"]["error"] == (
        "workflow runs is not supported by procmesh: procmesh runs a processor workflow in an agent's "
        "lanes or through getProcessor(id).execute(), never as a workflow run"
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
