"""A Python tool in the background (`BackgroundTool` around a `FunctionTool`, SEED-GAPS L4): a
deferred call answers the model at once while the function still runs, past the run's end; an
awaited one is retried and its result is the call's."""

from __future__ import annotations

import asyncio
from typing import Any

from procmesh_orchestrator.run import background
from procmesh_orchestrator.run.background import BackgroundOptions, BackgroundTool
from procmesh_orchestrator.run.function_tool import FunctionTool, FunctionToolContext
from tests.unit.orchestrator.run.fakes import Call, FakeModel, agent


async def test_a_deferred_python_tool_outlives_its_run() -> None:
    release, finished = asyncio.Event(), asyncio.Event()

    async def slow(args: Any, context: FunctionToolContext) -> Any:
        await release.wait()
        finished.set()
        return {"done": True}

    tool = BackgroundTool(FunctionTool("slow", "slow work", slow))
    log: list[Call] = []
    result = await agent(
        FakeModel({"tool_calls": ["slow"]}, {"text": "started"}), log, tools={"slow": tool}
    ).generate("go")
    assert result.status == "success", result.error
    (placeholder,) = [r["result"] for r in result.steps[0]["toolResults"]]
    assert placeholder.startswith("Background task started. Task ID: ")
    assert not finished.is_set()  # the run is over, the work is not
    release.set()
    await asyncio.wait_for(background.drain(), 10)
    assert finished.is_set()


async def test_an_awaited_python_tool_is_retried_and_its_result_is_the_calls() -> None:
    attempts: list[int] = []

    async def flaky(args: Any, context: FunctionToolContext) -> Any:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")
        return {"attempts": len(attempts)}

    options = BackgroundOptions(disposition="awaited", max_retries=1, retry_delay=0)
    tool = BackgroundTool(FunctionTool("flaky", "flaky work", flaky), options)
    log: list[Call] = []
    model = FakeModel({"tool_calls": ["flaky"]}, {"text": "done"})
    result = await agent(model, log, tools={"flaky": tool}).generate("go")
    assert result.status == "success", result.error
    assert [r["result"] for r in result.steps[0]["toolResults"]] == [{"attempts": 2}]
    assert attempts == [1, 2]
