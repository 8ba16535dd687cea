"""Tools hosted by sidecars, Python and Node, real processes, used by one agent over ExecuteTool.

The scripted model calls the tools; the tests read what comes back in the stream (tool-result and
tool-error chunks), what the model's next prompt shows of it, and what the sidecars saw (their
``stats`` tool): a result reaches the model, bad arguments never reach the tool, a tool's error is
the model's to read, and a sidecar that dies or stalls follows the tool's failure policy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.tools.harness import (
    call,
    collect,
    config,
    of_type,
    prompts,
    settled_inflight,
    stats,
    tool_outputs,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

DONE = {"text": "all done"}


def two_sidecars(py: str, node: str, responses: list[dict[str, Any]], **tools: dict[str, Any]) -> Config:
    return config(
        sidecars={"py": {"address": py, "timeout": 5}, "node": {"address": node, "timeout": 5}},
        tools=tools,
        responses=responses,
    )


WEATHER = {"sidecar": "py"}
SHOUT = {"sidecar": "node"}


async def test_one_agent_calls_a_python_and_a_node_tool(py_tools: str, node_tools: str) -> None:
    cfg = two_sidecars(
        py_tools,
        node_tools,
        [{"toolCalls": [call("weather", city="Paris"), call("shout", text="hello")]}, DONE],
        weather=WEATHER,
        shout=SHOUT,
    )
    async with App(cfg) as app:
        chunks, result = await collect(app)
        sent = prompts(app)
    assert result.status == "success", result.error
    assert result.text == "all done"
    weather = {"city": "Paris", "forecast": "sunny"}
    shouted = {"shouted": "HELLO"}
    results = {r["toolName"]: r["result"] for r in of_type(chunks, "tool-result")}
    assert results == {"weather": weather, "shout": shouted}
    assert of_type(chunks, "tool-error") == []
    assert len(sent) == 2
    assert tool_outputs(sent[1]) == {"call_1": weather, "call_2": shouted}
    assert [r["result"] for r in result.steps[0]["toolResults"]] == [weather, shouted]


async def test_arguments_the_schema_refuses_never_reach_the_tool(py_tools: str, node_tools: str) -> None:
    before = (await stats(py_tools))["calls"].get("weather", 0)
    cfg = two_sidecars(
        py_tools,
        node_tools,
        [{"toolCalls": [call("weather"), call("shout", text=5)]}, DONE],
        weather=WEATHER,
        shout=SHOUT,
    )
    async with App(cfg) as app:
        chunks, result = await collect(app)
        sent = prompts(app)
    assert result.status == "success", result.error
    errors = {e["toolName"]: e["error"] for e in of_type(chunks, "tool-error")}
    assert set(errors) == {"weather", "shout"}
    assert errors["weather"].startswith("Tool input validation failed for weather")
    assert "'city' is a required property" in errors["weather"]
    assert "5 is not of type 'string'" in errors["shout"]
    assert of_type(chunks, "tool-result") == []
    # the model is told, so it can call again with better arguments
    outputs = tool_outputs(sent[1])
    assert "'city' is a required property" in str(outputs.get("call_1")), sent[1]
    assert "5 is not of type 'string'" in str(outputs.get("call_2")), sent[1]
    assert (await stats(py_tools))["calls"].get("weather", 0) == before


async def test_a_raising_tool_is_a_tool_error_and_the_run_goes_on(py_tools: str) -> None:
    cfg = config(
        sidecars={"py": {"address": py_tools, "timeout": 5}},
        tools={"boom": {"sidecar": "py"}},
        responses=[{"toolCalls": [call("boom")]}, DONE],
    )
    async with App(cfg) as app:
        chunks, result = await collect(app)
        sent = prompts(app)
    assert result.status == "success", result.error
    assert result.text == "all done"
    assert [e["error"] for e in of_type(chunks, "tool-error")] == ["the boom tool exploded"]
    assert "the boom tool exploded" in str(tool_outputs(sent[1]).get("call_1")), sent[1]


@pytest.mark.parametrize("policy", ["fail-closed", "fail-open"])
async def test_a_sidecar_killed_mid_call_follows_the_policy(
    own_sidecar: Callable[[], SidecarProcess], policy: str
) -> None:
    doomed = own_sidecar()
    await doomed.wait_ready()
    cfg = config(
        sidecars={"doomed": {"address": doomed.address, "timeout": 5}},
        tools={"die": {"sidecar": "doomed", "onFailure": policy}},
        responses=[{"toolCalls": [call("die")]}, DONE],
    )
    async with App(cfg) as app:
        chunks, result = await collect(app)
    assert doomed.proc is not None
    assert doomed.proc.wait(5) == -9, "the die tool did not SIGKILL its sidecar"
    if policy == "fail-closed":
        assert result.status == "failed"
        assert result.error is not None
        assert "'tool:die'" in result.error, result.error
        assert [e["message"] for e in of_type(chunks, "error")] == [result.error]
        assert of_type(chunks, "tool-error") == []
    else:
        assert result.status == "success", result.error
        assert result.text == "all done"
        (error,) = of_type(chunks, "tool-error")
        assert error["toolName"] == "die"
        assert "unavailable" in error["error"]
        assert of_type(chunks, "error") == []


@pytest.mark.parametrize("policy", ["fail-closed", "fail-open"])
async def test_an_answer_with_a_result_and_an_error_is_malformed_under_the_policy(
    start_sidecar: Callable[..., SidecarProcess], sidecar_dir: Path, policy: str
) -> None:
    # a raw servicer's ExecuteTool answers {result, error}: the error won before, the result was
    # dropped without a word; now the answer is a failed call naming both
    liar = f"unix://{sidecar_dir / f'liar-{policy}.sock'}"
    faulty = start_sidecar("--liar-listen", liar, name=f"faulty-{policy}", module="tests.fixtures.faulty")
    await faulty.wait_ready()  # the liar server is up before the SDK server reports SERVING
    cfg = config(
        sidecars={"liar": {"address": liar, "timeout": 5}},
        tools={"two-answers": {"sidecar": "liar", "onFailure": policy}},
        responses=[{"toolCalls": [call("two-answers")]}, DONE],
    )
    async with App(cfg) as app:
        chunks, result = await collect(app)
        let_through = app.metrics.total("procmesh_processor_failures_let_through_total", hook="execute_tool")
    cause = "malformed response: result set beside error: a failed tool has no result"
    if policy == "fail-closed":
        assert result.status == "failed"
        assert result.error is not None
        assert "'tool:two-answers'" in result.error, result.error
        assert cause in result.error, result.error
    else:
        assert result.status == "success", result.error
        (error,) = of_type(chunks, "tool-error")
        assert "its sidecar failed (fail-open)" in error["error"], error  # the cause is logged
        assert let_through == 1
    assert of_type(chunks, "tool-result") == []


@pytest.mark.parametrize("policy", ["fail-closed", "fail-open"])
async def test_a_tool_past_its_timeout_follows_the_policy(py_tools: str, policy: str) -> None:
    cfg = config(
        sidecars={"py": {"address": py_tools, "timeout": 30}},
        tools={"slowpoke": {"sidecar": "py", "tool": "slow", "timeout": 0.3, "onFailure": policy}},
        responses=[{"toolCalls": [call("slowpoke", seconds=60)]}, DONE],
    )
    async with App(cfg) as app:
        chunks, result = await collect(app)
    if policy == "fail-closed":
        assert result.status == "failed"
        assert result.error is not None
        assert "'tool:slowpoke'" in result.error, result.error
        assert "after 30" not in result.error  # the tool's own timeout cut it, not the sidecar's
    else:
        assert result.status == "success", result.error
        assert result.text == "all done"
        assert [e["toolName"] for e in of_type(chunks, "tool-error")] == ["slowpoke"]
    # the call was cancelled on the sidecar, not left sleeping there
    assert (await settled_inflight(py_tools)).get("slow") == 0


async def test_execute_tool_carries_the_run_agent_and_thread(py_tools: str, node_tools: str) -> None:
    cfg = two_sidecars(
        py_tools,
        node_tools,
        [{"toolCalls": [call("context"), call("where")]}, DONE],
        context=WEATHER,
        where=SHOUT,
    )
    options = CallOptions(thread_id="t-1", resource_id="u-1", request_context={"tenant": "acme"})
    async with App(cfg) as app:
        chunks, result = await collect(app, options=options)
    assert result.status == "success", result.error
    results = {r["toolName"]: r["result"] for r in of_type(chunks, "tool-result")}
    assert results["context"] == {
        "runId": result.run_id,
        "agentId": "a",
        "toolCallId": "call_1",
        "threadId": "t-1",
        "resourceId": "u-1",
        "requestContext": {"tenant": "acme"},
    }
    assert results["where"] == {
        "runId": result.run_id,
        "agentId": "a",
        "threadId": "t-1",
        "toolCallId": "call_2",
        "requestContext": {"tenant": "acme"},
    }
