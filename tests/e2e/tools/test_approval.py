"""Tool approval at the Python API: a run suspends at a call that needs approval, and a SECOND App
built from the same config, sharing the store (a SQLite file, a PostgreSQL database), finishes it.

The tool sidecar is a real process; its ``stats`` tool tells what it saw: how often the tool ran,
how often processInput ran for the run, and what the ``tracker`` processor's state and the request
context were when the run ended.

The second App's scripted model is given the rest of the script: a scripted model's place in its
script is per process, and a real model, being stateless, would answer the resumed prompt so.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config
from procmesh_orchestrator.errors import ResumeConflictError, SuspendedRunNotFoundError
from procmesh_orchestrator.run import CallOptions, RunResult
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.run.tool_calls import DECLINED
from tests.e2e.memory.test_store_safety import postgres_dsn
from tests.e2e.tools.harness import call, collect, config, of_type, prompts, stats, tool_outputs
from tests.integration.memory.pg import fresh_dsn

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

__all__ = ["postgres_dsn"]  # the module's PostgreSQL server (tests/e2e/memory)

ASK = {"text": "sending", "toolCalls": [call("transfer", amount=5)]}
ANSWER = {"text": "sent it"}
CONTEXT = {"tenant": "acme"}


def approval_config(py_tools: str, storage: dict[str, Any], responses: list[dict[str, Any]]) -> Config:
    return config(
        sidecars={"py": {"address": py_tools, "timeout": 5}},
        tools={"transfer": {"sidecar": "py", "requireApproval": True}},
        responses=responses,
        inputProcessors=["py/inputs"],
        outputProcessors=["py/tracker"],
        memory={"lastMessages": 50},
        top={"storage": storage},
    )


@pytest.fixture(params=["sqlite", "postgres"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """An empty store both Apps share: a new SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield {"path": str(tmp_path / "memory.db")}
    else:
        yield {"backend": "postgres", "dsn": fresh_dsn(request.getfixturevalue("postgres_dsn"))}


@pytest_asyncio.fixture(loop_scope="module")
async def replicas(py_tools: str, storage: dict[str, Any]) -> AsyncIterator[tuple[App, App]]:
    """The App that suspends and the one that resumes (the rest of the script), on one store."""
    async with (
        App(approval_config(py_tools, storage, [ASK, ANSWER])) as first,
        App(approval_config(py_tools, storage, [ANSWER])) as second,
    ):
        yield first, second


def options() -> CallOptions:
    return CallOptions(thread_id=f"th-{uuid.uuid4().hex[:8]}", resource_id="u-1", request_context=CONTEXT)


async def suspend(app: App, opts: CallOptions) -> RunResult:
    chunks, result = await collect(app, "send 5", opts)
    kinds = [c["type"] for c in chunks]
    assert kinds[-2:] == ["tool-call-approval", "finish"], kinds
    assert chunks[-1]["payload"]["finishReason"] == "suspended"
    (asked,) = of_type(chunks, "tool-call-approval")
    assert (asked["toolName"], asked["args"]) == ("transfer", {"amount": 5})
    assert result.status == "suspended"
    assert [s["toolCallId"] for s in result.suspended] == [asked["toolCallId"]]
    assert of_type(chunks, "tool-result") == []
    return result


def turn(stored: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["role"], message_text(m)) for m in stored]


async def thread(app: App, thread_id: str) -> list[dict[str, Any]]:
    assert app.store is not None
    return await app.store.messages(thread_id, "u-1")


async def transfers(py_tools: str) -> int:
    return int((await stats(py_tools))["calls"].get("transfer", 0))


async def test_approval_on_another_replica_finishes_the_run_as_if_never_suspended(
    py_tools: str, storage: dict[str, Any], replicas: tuple[App, App]
) -> None:
    first, second = replicas
    ran = await transfers(py_tools)
    opts = options()
    suspended = await suspend(first, opts)
    assert await transfers(py_tools) == ran, "the tool ran before it was approved"
    call_id = suspended.suspended[0]["toolCallId"]

    result = await second.agent("a").approve_tool_call(suspended.run_id, call_id)
    assert result.status == "success", result.error
    assert result.run_id == suspended.run_id
    assert await transfers(py_tools) == ran + 1
    assert tool_outputs(prompts(second)[0]) == {call_id: {"sent": 5}}

    # the same run, never suspended (its own App and thread)
    baseline_opts = replace(options(), require_tool_approval=False)
    async with App(approval_config(py_tools, storage, [ASK, ANSWER])) as plain:
        baseline = await plain.agent("a").generate("send 5", baseline_opts)
        baseline_turn = turn(await thread(plain, baseline_opts.thread_id))
    assert result.text == baseline.text == "sendingsent it"
    assert result.steps == baseline.steps
    assert [len(s["toolResults"]) for s in result.steps] == [1, 0]
    assert result.steps[0]["toolResults"][0]["result"] == {"sent": 5}

    # memory holds the whole turn once
    stored = await thread(second, opts.thread_id)
    assert turn(stored) == baseline_turn
    assert [m["role"] for m in stored] == ["user", "assistant", "assistant"]
    assert len({m["id"] for m in stored}) == len(stored)

    # processor state and request context survived; processInput ran once, before the suspension
    seen = (await stats(py_tools, suspended.run_id))["run"]
    never_suspended = (await stats(py_tools, baseline.run_id))["run"]
    assert seen == never_suspended == {"processInput": 1, "steps": 2, "tenant": "acme"}

    with pytest.raises(ResumeConflictError):
        await second.agent("a").approve_tool_call(suspended.run_id, call_id)
    with pytest.raises(ResumeConflictError):
        await first.agent("a").approve_tool_call(suspended.run_id, call_id)


@pytest.mark.parametrize("reason", [None, "not today"])
async def test_a_declined_call_never_runs_and_the_model_is_told(
    py_tools: str, replicas: tuple[App, App], reason: str | None
) -> None:
    first, second = replicas
    ran = await transfers(py_tools)
    suspended = await suspend(first, options())
    call_id = suspended.suspended[0]["toolCallId"]
    result = await second.agent("a").decline_tool_call(suspended.run_id, call_id, reason)
    assert result.status == "success", result.error
    assert await transfers(py_tools) == ran
    assert tool_outputs(prompts(second)[0]) == {call_id: reason or DECLINED}
    assert DECLINED == "Tool call was not approved by the user"


async def test_an_unknown_run_is_not_found(replicas: tuple[App, App]) -> None:
    _, second = replicas
    with pytest.raises(SuspendedRunNotFoundError):
        await second.agent("a").approve_tool_call("no-such-run", "call_1")
