"""`AgentSpec.ended` (the App's `run_ended`): told each run's id once, as the run ends, however it
started and however it ended, so the model gateway can cancel the judge questions of every run,
not only those an API registered under a caller's ``runId`` (issue 33 item 2)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.run import CallOptions
from procmesh_orchestrator.run.hooks import APIErrorResult, InputResult, Reply
from tests.unit.orchestrator.run.fakes import FakeModel, FakeProcessor, abort, agent, reply


async def test_a_generate_without_a_run_id_tells_its_own_id() -> None:
    ended: list[str] = []
    result = await agent(FakeModel({"text": "hi"}), [], ended=ended.append).generate("go")
    assert ended == [result.run_id]  # the id it made itself


async def test_a_tripped_a_failed_and_a_streamed_run_tell_theirs() -> None:
    ended: list[str] = []
    guard = FakeProcessor(
        "guard", {"process_input": lambda args, info: reply(InputResult(), abort=abort("guard", "no"))}
    )
    tripped = await agent(FakeModel({"text": "hi"}), [], input=(guard,), ended=ended.append).generate("go")
    assert tripped.tripwire is not None
    with pytest.raises(APICallError):
        await agent(FakeModel({"error": "down"}), [], ended=ended.append).generate(
            "go", CallOptions(run_id="r-2")
        )
    run = agent(FakeModel({"text": "hi"}), [], ended=ended.append).stream("go")
    streamed = await run.result()
    assert ended == [tripped.run_id, "r-2", streamed.run_id]


async def test_an_aborted_run_tells_its_id() -> None:
    ended: list[str] = []
    signal = asyncio.Event()
    signal.set()
    result = await agent(FakeModel({"text": "hi"}), [], ended=ended.append).generate(
        "go", CallOptions(abort_signal=signal)
    )
    assert ended == [result.run_id]


async def test_a_failed_model_call_tells_its_run_id_before_the_error_processors_and_the_run_goes_on() -> None:
    # `AgentSpec.attempt_failed` (the App's `attempt_failed`): the model gateway cancels the
    # failed attempt's judge questions then, before a retry can ask its own
    told: list[str] = []
    ended: list[str] = []

    def retry(args: Any, info: Any) -> Reply[Any]:
        told.append("processAPIError")
        return reply(APIErrorResult(retry=True))

    model = FakeModel({"error": "overloaded"}, {"text": "fine now"})
    retrier = FakeProcessor("retrier", {"process_api_error": retry})
    result = await agent(
        model, [], error=(retrier,), max_processor_retries=1, attempt_failed=told.append, ended=ended.append
    ).generate("go")
    assert result.text == "fine now "
    assert told == [result.run_id, "processAPIError"]  # once, first
    assert ended == [result.run_id]
