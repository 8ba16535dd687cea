"""A processor workflow executed through the API (SEED-GAPS I11): `@mastra/client-js` 1.47's
``getProcessor(id).execute()`` on a workflow, against one `procmesh-orchestrator` process and real
sidecar processes (``examples`` and the failing processors of ``tests.fixtures.faulty``).

``screen`` holds an error step (``breaker`` fails, the PII redactor runs in its place), a nested
workflow (``guarded``: the topic guard) and a branch on the caller's resource (a tenant key's
``acme`` gets one more guard): the workflow runs as an agent's lane runs it, each step on what the
ones before it made of the messages, and a tripwire stops it with its processor's id.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.service.conftest import OrchestratorProcess, run_clientjs
from tests.integration.service.support import API_KEY, API_KEYS

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

TENANT_KEY = "acme-key-0123456789"
WORKFLOWS = {
    "guarded": {"steps": [{"processor": "ex/topic-guard", "options": {"words": ["jailbreak"]}}]},
    "screen": {
        "steps": [
            {"try": "f/breaker", "catch": "ex/pii-redactor"},
            "workflow:guarded",
            {
                "when": {"key": "resourceId", "equals": "acme"},
                "then": [
                    {"processor": "ex/topic-guard", "name": "acme-guard", "options": {"words": ["refund"]}}
                ],
            },
        ]
    },
    "concise": {
        "steps": [{"processor": "ex/length-check", "options": {"max_words": {"fromContext": "maxWords"}}}]
    },
    "broken": {"steps": ["f/breaker"]},
}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def orchestrator(
    start_sidecar: Callable[..., SidecarProcess],
    start_orchestrator: Callable[..., OrchestratorProcess],
) -> OrchestratorProcess:
    examples = start_sidecar("examples", name="wfx-examples")
    faulty = start_sidecar(name="wfx-faulty", module="tests.fixtures.faulty")
    await asyncio.gather(examples.wait_ready(), faulty.wait_ready())
    config = {
        "sidecars": {"ex": {"address": examples.address}, "f": {"address": faulty.address}},
        "models": {"demo": {"provider": "demo"}},
        "workflows": WORKFLOWS,
        "agents": {
            "a": {"model": "demo", "errorProcessorDefaults": False, "inputProcessors": ["workflow:screen"]}
        },
    }
    env = {
        "PROCMESH_API_KEYS": f"{API_KEYS},{TENANT_KEY}=acme",
        "PROCMESH_TRUSTED_CONTEXT": json.dumps({"*": ["maxWords"]}),
    }
    return await asyncio.to_thread(start_orchestrator, config, env=env)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def out(orchestrator: OrchestratorProcess) -> dict[str, Any]:
    got: dict[str, Any] = await asyncio.to_thread(
        run_clientjs, "workflow_execute.mjs", orchestrator, API_KEY, TENANT_KEY
    )
    return got


def ok(out: dict[str, Any], name: str) -> Any:
    assert "ok" in out[name], (name, out[name])
    return out[name]["ok"]


def texts(answer: dict[str, Any]) -> list[str]:
    return [p["text"] for m in answer["messageList"]["messages"] for p in m["content"]["parts"]]


async def test_the_workflow_runs_its_error_step_and_nested_workflow(out: dict[str, Any]) -> None:
    passed = ok(out, "passes")
    assert (passed["success"], passed["phase"]) == (True, "input")
    assert texts(passed) == ["mail [email]"]  # breaker failed: its catch redacted in its place
    assert passed["messages"] == passed["messageList"]["messages"]


async def test_a_nested_workflows_tripwire_stops_it_with_its_processors_id(out: dict[str, Any]) -> None:
    aborted = ok(out, "nestedAbort")
    assert (aborted["success"], aborted["tripwire"]["triggered"]) == (False, True)
    assert aborted["tripwire"]["reason"] == "Blocked: the request mentions 'jailbreak'"
    assert aborted["tripwire"]["metadata"]["processorId"] == "topic-guard"
    assert aborted["tripwire"]["metadata"]["retry"] is False
    # the messages as the workflow had made them when it stopped: the catch step's redaction
    assert texts(aborted) == ["jailbreak, then mail [email]"]


async def test_a_branch_follows_the_callers_resource(out: dict[str, Any]) -> None:
    tenant = ok(out, "tenantAbort")
    assert tenant["success"] is False
    assert tenant["tripwire"]["metadata"]["processorId"] == "acme-guard"
    operator = ok(out, "operatorNoBranch")  # the operator key acts for no resource: no branch
    assert (operator["success"], texts(operator)) == (True, ["a refund please"])


async def test_options_from_the_request_context_reach_the_steps(out: dict[str, Any]) -> None:
    step = ok(out, "withContext")
    assert (step["success"], step["phase"]) == (False, "outputStep")
    assert step["tripwire"]["reason"] == "Answer in at most 3 words."
    assert step["tripwire"]["metadata"]["retry"] is True
    refused = out["badContext"]  # an option the processor's schema refuses: 400 before any call
    assert refused["status"] == 400, refused
    assert "max_words" in refused["body"]["error"]


async def test_an_uncaught_failure_is_the_answers_error(out: dict[str, Any]) -> None:
    failed = ok(out, "uncaught")
    assert (failed["success"], failed["phase"]) == (False, "input")
    assert "breaker" in failed["error"]
    assert "tripwire" not in failed


async def test_the_workflow_lists_the_phases_its_steps_run(out: dict[str, Any]) -> None:
    details = ok(out, "details")
    assert (details["id"], details["isWorkflow"], details["phases"]) == ("screen", True, ["input"])
    listed = ok(out, "listed")
    assert listed["concise"]["phases"] == ["outputStep"]
    assert listed["screen"]["configurations"] == [{"agentId": "a", "type": "input"}]


async def test_bad_input_is_a_400_naming_it(out: dict[str, Any], orchestrator: OrchestratorProcess) -> None:
    missing = out["missingPhase"]
    assert missing["status"] == 400
    assert "processor workflow 'screen' has no outputStream phase" in missing["body"]["error"]
    assert out["tenantReserved"]["status"] == 400  # a reserved key: a tenant cannot pose as another
    assert "resourceId" in out["tenantReserved"]["body"]["error"]
    assert out["unknownAgent"]["status"] == 404
    headers = {"Authorization": f"Bearer {API_KEY}"}
    message = {
        "id": "m1",
        "role": "user",
        "content": {"format": 2, "parts": [{"type": "text", "text": "hi"}]},
    }
    async with httpx.AsyncClient(base_url=orchestrator.http_url, headers=headers, timeout=30) as http:
        unknown = await http.post(
            "/api/processors/screen/execute",
            json={"phase": "input", "messages": [message], "threadId": "t", "resourceId": "acme"},
        )
        no_phase = await http.post("/api/processors/screen/execute", json={"messages": [message]})
        not_a_list = await http.post(
            "/api/processors/screen/execute", json={"phase": "input", "messages": "hi"}
        )
        no_workflow = await http.post(
            "/api/processors/nothing/execute", json={"phase": "input", "messages": []}
        )
    assert unknown.status_code == 400
    assert unknown.json()["error"].startswith("unknown keys: 'resourceId', 'threadId'")
    assert (no_phase.status_code, no_phase.json()["error"]) == (400, "phase: required")
    assert (not_a_list.status_code, not_a_list.json()["error"]) == (
        400,
        "messages: must be a list of messages",
    )
    assert no_workflow.status_code == 404
