"""A tool that suspends itself for the caller's input (SEED-GAPS P6) and a tool's lifecycle hooks
(P7), at the Python API, on a real SDK sidecar: the Python SDK's (`tests.fixtures.suspend_sidecar`)
and the Node SDK's (`tests/fixtures/node_suspend_tools.js`), the same tools.

A run whose ``weather`` tool suspends is kept in the store (a SQLite file); a SECOND App on the
same store resumes it with data, and the tool, run again, sees that data and what it asked. The
second App's scripted model is given the rest of the script (a scripted model's place in it is per
process; a real, stateless model would answer the resumed prompt so).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.errors import ResumeConflictError, ResumeMismatchError, SuspendedRunNotFoundError
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.e2e.node.conftest import node_sidecar, require_node
from tests.e2e.tools.harness import call, collect, config, of_type, prompts, tool_outputs
from tests.integration.service.support import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

NODE_TOOLS = REPO / "tests" / "fixtures" / "node_suspend_tools.js"
ASK = {"text": "checking", "toolCalls": [call("weather", city="Paris")]}
ANSWER = {"text": "here it is"}
UNIT = {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["unit"]}


class Tools(NamedTuple):
    address: str
    metrics_port: int


@pytest.fixture(scope="module", params=["python", "node"])
def suspend_tools(
    request: pytest.FixtureRequest,
    start_sidecar: Callable[..., SidecarProcess],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Tools]:
    """The suspend tools' sidecar (its address and metrics port): `tests.fixtures.suspend_sidecar`
    (Python SDK) or `tests/fixtures/node_suspend_tools.js` (Node SDK), the same tools."""
    port = free_port()
    if request.param == "python":
        proc = start_sidecar("--metrics-port", str(port), name="sus", module="tests.fixtures.suspend_sidecar")
    else:
        require_node()
        where = tmp_path_factory.mktemp("nsus")
        proc = node_sidecar(
            NODE_TOOLS, f"unix://{where / 'n.sock'}", where / "n.log", "--metrics-port", str(port)
        )
    asyncio.run(proc.wait_ready())
    yield Tools(proc.address, port)
    if request.param == "node":
        proc.stop(grace=2.0)


async def tool_calls(port: int, tool: str, outcome: str) -> float:
    """The sidecar's ``procmesh_sidecar_tool_calls_total{tool, outcome}`` (0 before the first)."""
    async with httpx.AsyncClient(timeout=5) as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "procmesh_sidecar_tool_calls_total" and sample.labels == {
                "tool": tool,
                "outcome": outcome,
            }:
                return sample.value
    return 0.0


def suspend_config(address: str, store: Path, responses: list[dict[str, Any]]) -> Config:
    return config(
        sidecars={"sus": {"address": address, "timeout": 5}},
        tools={"weather": {"sidecar": "sus"}, "traced": {"sidecar": "sus"}, "hooks": {"sidecar": "sus"}},
        responses=responses,
        top={"storage": {"path": str(store)}},
    )


async def test_a_suspended_tool_resumes_with_data_on_another_app(
    suspend_tools: Tools, tmp_path: Path
) -> None:
    store = tmp_path / "memory.db"
    async with (
        App(suspend_config(suspend_tools.address, store, [ASK, ANSWER])) as first,
        App(suspend_config(suspend_tools.address, store, [ANSWER, ANSWER])) as second,
    ):
        chunks, suspended = await collect(first, "weather in Paris?")
        assert [c["type"] for c in chunks][-2:] == ["tool-call-suspended", "finish"]
        (asked,) = of_type(chunks, "tool-call-suspended")
        question = {"question": "Which unit for Paris?"}
        assert asked["suspendPayload"] == question
        assert asked["args"] == {"city": "Paris"}
        assert asked["toolName"] == "weather"
        assert json.loads(asked["resumeSchema"]) == UNIT
        assert suspended.status == "suspended"
        assert suspended.finish_reason == "suspended"
        call_id = asked["toolCallId"]
        assert suspended.suspended == [
            {
                "toolCallId": call_id,
                "toolName": "weather",
                "args": {"city": "Paris"},
                "suspendPayload": question,
            }
        ]
        agent = second.agent("a")

        # the wrong kind of answer, or the wrong call, is refused; the run stays suspended
        with pytest.raises(ResumeMismatchError, match="awaits resume data, not an approval"):
            await agent.approve_tool_call(suspended.run_id, call_id)
        with pytest.raises(SuspendedRunNotFoundError):
            await agent.resume_generate(suspended.run_id, "no-such-call", {"unit": "celsius"})

        resumed = await agent.resume_generate(suspended.run_id, call_id, {"unit": "celsius"})
        assert resumed.status == "success", resumed.error
        assert resumed.text == "checkinghere it is"  # the text of every step, as after an approval
        result = {"city": "Paris", "unit": "celsius", "asked": question, "runs": 2}
        assert [r["result"] for r in resumed.steps[0]["toolResults"]] == [result]
        assert tool_outputs(prompts(second)[0])[call_id] == result

        with pytest.raises(ResumeConflictError):
            await agent.resume_generate(suspended.run_id, call_id, {"unit": "fahrenheit"})


async def test_a_tool_call_that_suspends_is_counted_suspended(suspend_tools: Tools, tmp_path: Path) -> None:
    """Both SDKs count it ``outcome="suspended"`` (the Node SDK counted it ``ok``)."""
    port = suspend_tools.metrics_port
    before = [await tool_calls(port, "weather", outcome) for outcome in ("suspended", "ok")]
    async with App(suspend_config(suspend_tools.address, tmp_path / "memory.db", [ASK, ANSWER])) as app:
        _, suspended = await collect(app, "weather in Paris?")
    assert suspended.status == "suspended"
    after = [await tool_calls(port, "weather", outcome) for outcome in ("suspended", "ok")]
    assert [a - b for a, b in zip(after, before, strict=True)] == [1, 0]


async def test_resume_data_answers_an_approval_only_as_a_decision(
    suspend_tools: Tools, tmp_path: Path
) -> None:
    cfg = config(
        sidecars={"sus": {"address": suspend_tools.address, "timeout": 5}},
        tools={"traced": {"sidecar": "sus", "requireApproval": True}},
        responses=[{"toolCalls": [call("traced")]}, ANSWER],
        top={"storage": {"path": str(tmp_path / "memory.db")}},
    )
    async with App(cfg) as app:
        _, suspended = await collect(app)
        (awaited,) = suspended.suspended
        agent = app.agent("a")
        with pytest.raises(ResumeMismatchError, match=r"resumeData must be \{approved: boolean"):
            await agent.resume_generate(suspended.run_id, awaited["toolCallId"], {"unit": "celsius"})
        stream = await agent.resume_stream(
            suspended.run_id, awaited["toolCallId"], resume_data={"approved": False, "reason": "not now"}
        )
        chunks = [c async for c in stream]
        assert of_type(chunks, "tool-result")[0]["result"] == "not now"


async def test_lifecycle_hooks_come_in_order_and_a_raising_hook_fails_nothing(
    suspend_tools: Tools, tmp_path: Path
) -> None:
    steps = [
        {"toolCalls": [call("traced", **{"raise": True})]},
        {"toolCalls": [{"name": "hooks", "args": {"callId": "call_1"}}]},
        ANSWER,
    ]
    async with App(suspend_config(suspend_tools.address, tmp_path / "m.db", steps)) as app:
        chunks, result = await collect(app)
    assert result.status == "success", result.error
    traced, recorded = (r["result"] for r in of_type(chunks, "tool-result"))
    assert traced == {"done": True}
    assert recorded == [
        ["on_input_start"],
        ["on_input_available", {"raise": True}],
        ["execute", {"raise": True}],
        ["on_output", {"done": True}],
    ]


async def test_the_calls_beside_a_suspended_one_settle_and_only_it_runs_again(
    suspend_tools: Tools, tmp_path: Path
) -> None:
    steps = [
        {"toolCalls": [call("weather", city="Oslo"), call("traced")]},
        {"toolCalls": [{"name": "hooks", "args": {"callId": "call_2"}}]},
        ANSWER,
    ]
    async with App(suspend_config(suspend_tools.address, tmp_path / "m.db", steps)) as app:
        chunks, suspended = await collect(app)
        # each at its call's turn, in the model's order: the suspension, then the other result
        assert [c["type"] for c in chunks][-3:] == ["tool-call-suspended", "tool-result", "finish"]
        assert [s["toolName"] for s in suspended.suspended] == ["weather"]
        resumed = await app.agent("a").resume_generate(suspended.run_id, "call_1", {"unit": "fahrenheit"})
    assert resumed.status == "success", resumed.error
    settled = {r["toolName"]: r["result"] for r in resumed.steps[0]["toolResults"]}
    assert settled["traced"] == {"done": True}
    assert settled["weather"]["unit"] == "fahrenheit"
    (recorded,) = [r["result"] for r in resumed.steps[1]["toolResults"]]
    assert [event[0] for event in recorded].count("execute") == 1  # traced did not run again
