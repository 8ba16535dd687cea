"""A hook's request-context value reaches the rest of the run (issue 26 item 4), over real processes.

Two sidecar processes of tests/fixtures/tool_sidecar.py: in the first, ``tagger`` sets
``tier: gold`` in ``processInput``; in the second, ``witness`` records the context its
``processInput`` and ``processInputStep`` got. The run's tools see the value too: the sidecar's
``context`` tool in its ExecuteTool request, the MCP fixture server's ``context`` tool in the call's
``params._meta``, a client tool in its ``tool-call`` chunk. A hook that sets a reserved key
(``resourceId``) fails the run naming the processor and the key (fail-closed) or is dropped and
counted (fail-open). A run suspended for approval and resumed by a second App on the same SQLite
store runs the approved tool with the value, and so does a durable run another replica took over
(a Node hook in the lane sees and sets values the same way), with the lane its caller's context
chose (``inputProcessorsByContext``).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.durable import DurableRuns
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.tools import ClientTool
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.conftest import REPO
from tests.e2e.tools.harness import call, collect, config, of_type, stats
from tests.integration.test_mcp import SERVER

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

CALLER = {"tenant": "acme"}
SEEN = {"tenant": "acme", "tier": "gold"}
TOOLS = {
    "whoami": {"sidecar": "py", "tool": "context"},
    "mcpContext": {"mcp": "ctx", "tool": "context"},
}
MCP = {"ctx": {"command": [sys.executable, str(SERVER), "--transport", "stdio"], "cwd": str(REPO)}}


def tagger(values: dict[str, Any], **entry: Any) -> dict[str, Any]:
    return {"processor": "py/tagger", "options": {"values": values}, **entry}


def context_config(
    py_tools: str,
    witness: str,
    responses: list[dict[str, Any]],
    *,
    tag: dict[str, Any] | None = None,
    **more: Any,
) -> Config:
    sidecars = {
        "py": {"address": py_tools, "timeout": 5},
        "py2": {"address": witness, "timeout": 5},
        **more.pop("sidecars", {}),
    }
    return config(
        sidecars=sidecars,
        tools=more.pop("tools", TOOLS),
        responses=responses,
        inputProcessors=more.pop("inputProcessors", [tag or tagger({"tier": "gold"}), "py2/witness"]),
        top={"mcpServers": MCP, **more.pop("top", {})},
        **more,
    )


@pytest.fixture
def witness(own_sidecar: Callable[[], SidecarProcess]) -> str:
    """A second tool-sidecar process: the later hook runs there, not where the value was set."""
    proc = own_sidecar()
    return proc.address


def failed_open(app: App, entry: str, hook: str) -> float:
    """procmesh_processor_calls_total{outcome="failed_open"} of the lane entry `entry` in `hook`."""
    return sum(
        sample.value
        for metric in app.metrics.registry.collect()
        if metric.name == "procmesh_processor_calls"
        for sample in metric.samples
        if sample.name.endswith("_total")
        and sample.labels.get("outcome") == "failed_open"
        and sample.labels.get("hook") == hook
        and entry in sample.labels.values()
    )


async def seen(address: str, run_id: str) -> list[dict[str, Any]]:
    run = (await stats(address, run_id))["run"]
    return list(run.get("seen", []))


async def test_later_hooks_and_the_runs_tools_see_a_value_processinput_set(
    py_tools: str, witness: str
) -> None:
    script = [{"toolCalls": [call("whoami"), call("mcpContext")]}, {"text": "done"}]
    async with App(context_config(py_tools, witness, script)) as app:
        chunks, result = await collect(app, "hi", CallOptions(request_context=dict(CALLER)))
    assert result.status == "success", result.error
    hooks = await seen(witness, result.run_id)
    assert hooks == [
        {"hook": "process_input", "context": SEEN},
        {"hook": "process_input_step", "context": SEEN},
        {"hook": "process_input_step", "context": SEEN},
    ]
    results = {r["toolName"]: r["result"] for r in of_type(chunks, "tool-result")}
    assert results["whoami"]["requestContext"] == SEEN  # the sidecar tool's ExecuteTool request
    assert json.loads(results["mcpContext"]["result"]) == SEEN  # the MCP call's params._meta


async def test_a_node_hook_sees_the_value_and_sets_one_of_its_own(
    py_tools: str, node_tools: str, witness: str
) -> None:
    cfg = context_config(
        py_tools,
        witness,
        [{"toolCalls": [call("nodeWhere")]}, {"text": "done"}],
        tools={"nodeWhere": {"sidecar": "node", "tool": "where"}},
        inputProcessors=[tagger({"tier": "gold"}), "node/echo", "py2/witness"],
        sidecars={"node": {"address": node_tools, "timeout": 5}},
    )
    async with App(cfg) as app:
        chunks, result = await collect(app, "hi", CallOptions(request_context=dict(CALLER)))
    assert result.status == "success", result.error
    both = {**SEEN, "nodeSaw": "gold"}  # the Node hook saw the Python hook's value, and set its own
    assert [h["context"] for h in await seen(witness, result.run_id)] == [both, both, both]
    (where,) = [r["result"] for r in of_type(chunks, "tool-result")]
    assert where["requestContext"] == both  # a Node SDK tool's ToolContext


async def test_a_client_tools_call_chunk_carries_the_value(py_tools: str, witness: str) -> None:
    script = [{"text": "asking", "toolCalls": [call("confirm", what="pay")]}]
    options = CallOptions(request_context=dict(CALLER), client_tools=[ClientTool("confirm", "Ask the user.")])
    async with App(context_config(py_tools, witness, script)) as app:
        chunks, result = await collect(app, "hi", options)
    assert result.finish_reason == "tool-calls", result.error
    (asked,) = of_type(chunks, "tool-call")
    assert asked["toolName"] == "confirm"
    assert asked["requestContext"] == SEEN


async def test_a_reserved_key_fails_the_run_naming_the_processor_and_the_key(
    py_tools: str, witness: str
) -> None:
    thief = tagger({"resourceId": "someone-else", "tier": "gold"}, name="thief")
    async with App(context_config(py_tools, witness, [{"text": "never"}], tag=thief)) as app:
        chunks, result = await collect(app, "hi", CallOptions(request_context=dict(CALLER)))
    assert result.status == "failed"
    assert result.error is not None
    assert "'thief'" in result.error
    assert "process_input" in result.error
    assert "'resourceId'" in result.error
    assert "reserved" in result.error
    assert await seen(witness, result.run_id) == []  # no later hook ran
    assert of_type(chunks, "text-delta") == []  # nor the model


async def test_a_fail_open_processor_setting_a_reserved_key_is_dropped_and_counted(
    py_tools: str, witness: str
) -> None:
    thief = tagger({"resourceId": "someone-else", "tier": "gold"}, name="thief", onFailure="fail-open")
    async with App(context_config(py_tools, witness, [{"text": "fine"}], tag=thief)) as app:
        _, result = await collect(app, "hi", CallOptions(request_context=dict(CALLER)))
        counted = failed_open(app, "thief", "process_input")
    assert result.status == "success", result.error
    assert await seen(witness, result.run_id) == [
        {"hook": "process_input", "context": CALLER},  # nothing of the refused answer applied
        {"hook": "process_input_step", "context": CALLER},
    ]
    assert counted == 1


async def test_a_run_suspended_for_approval_resumes_elsewhere_with_the_value(
    py_tools: str, witness: str, tmp_path: Path
) -> None:
    tools = {**TOOLS, "whoami": {"sidecar": "py", "tool": "context", "requireApproval": True}}
    storage = {"storage": {"path": str(tmp_path / "memory.db")}}
    ask = {"text": "checking", "toolCalls": [call("whoami")]}
    first_config = context_config(py_tools, witness, [ask, {"text": "done"}], tools=tools, top=storage)
    second_config = context_config(py_tools, witness, [{"text": "done"}], tools=tools, top=storage)
    async with App(first_config) as first, App(second_config) as second:
        chunks, suspended = await collect(first, "hi", CallOptions(request_context=dict(CALLER)))
        assert suspended.status == "suspended", suspended.error
        (asked,) = of_type(chunks, "tool-call-approval")
        # the resuming caller sends its own context again; the value the hook set stays
        resumer = CallOptions(request_context={**CALLER, "tier": "bronze"})
        done = await second.agent("a").approve_tool_call(suspended.run_id, asked["toolCallId"], resumer)
    assert done.status == "success", done.error
    (ran,) = done.steps[0]["toolResults"]
    assert ran["result"]["requestContext"] == SEEN
    steps = [h for h in await seen(witness, suspended.run_id) if h["hook"] == "process_input_step"]
    assert [h["context"] for h in steps] == [SEEN, SEEN]  # before the suspension and after


WORDS = "one two three four five six seven eight nine ten"


def durable_config(py_tools: str, witness: str, db: Path, responses: list[dict[str, Any]]) -> Config:
    # the lane is chosen by the caller's tenant: only acme's has the witness, so a replica that
    # took the run over and chose again from anything but the context the run started with would
    # call no witness in its steps
    by_tenant = {"key": "tenant", "cases": {"acme": [tagger({"tier": "gold"}), "py2/witness"]}}
    return context_config(
        py_tools,
        witness,
        [],
        inputProcessors=[],
        inputProcessorsByContext=by_tenant,
        model={"provider": "scripted", "delayMs": 20, "responses": responses},
        tools={"lookup": {"result": "found"}, "whoami": {"sidecar": "py", "tool": "context"}},
        durable=True,
        memory={},
        top={
            "storage": {"backend": "sqlite", "path": str(db)},
            "durable": {"leaseSeconds": 0.6, "claimIntervalSeconds": 0.1},
        },
    )


async def test_a_durable_run_taken_over_by_another_replica_goes_on_with_the_value(
    py_tools: str, witness: str, tmp_path: Path
) -> None:
    step_0 = {"text": WORDS, "toolCalls": [call("lookup")]}
    step_1 = {"text": WORDS, "toolCalls": [call("whoami")]}
    done = {"text": "done"}
    db = tmp_path / "runs.db"
    async with (
        App(durable_config(py_tools, witness, db, [step_0, step_1, done])) as a,
        App(durable_config(py_tools, witness, db, [step_1, done])) as b,
    ):
        assert a.durable is not None
        assert b.durable is not None
        run_id = await a.durable.begin("a", "hi", CallOptions(request_context=dict(CALLER)))
        seen_by_a: list[tuple[int, dict[str, Any]]] = []
        async with asyncio.timeout(20):  # past step 0's checkpoint, into step 1's text
            async for offset, chunk in a.durable.attach(run_id, 0):
                seen_by_a.append((offset, chunk))
                texts_after_tool = [
                    c for _, c in seen_by_a if c["type"] == "text-delta" and c["payload"]["text"].strip()
                ]
                if any(c["type"] == "tool-result" for _, c in seen_by_a) and len(texts_after_tool) > 12:
                    break
        await a.durable.close()  # replica A dies; the lease runs out
        by_a = len(await seen(witness, run_id))
        await b.durable.close()  # the taker below reads A's in-process event log
        taker = DurableRuns(
            b.suspended_runs_store, a.durable.events, b.durable.agents, b.metrics, b.durable.settings
        )
        await taker.start()
        try:
            rest: list[dict[str, Any]] = []
            async with asyncio.timeout(20):
                async for _, chunk in taker.attach(run_id, seen_by_a[-1][0] + 1):
                    rest.append(chunk)
        finally:
            await taker.close()
        record = await (await b.suspended_runs_store()).get_durable_run(run_id)
    assert record is not None
    assert record.attempts == 2  # taken over
    assert rest[-1]["type"] == "finish"
    (whoami,) = [c["payload"]["result"] for c in rest if c["type"] == "tool-result"]
    assert whoami["requestContext"] == SEEN  # the tool run by the replica that took the run over
    hooks = await seen(witness, run_id)
    assert all(h["context"] == SEEN for h in hooks)
    assert hooks[0]["hook"] == "process_input"  # on A only: a resumed run does not run it again
    # the taker chose acme's lane again: its steps called the witness too
    assert [h["hook"] for h in hooks[by_a:]] == ["process_input_step"] * (len(hooks) - by_a) != []
