"""ensure-final-response, steering-reminder and background-work-signals through one real sidecar process."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import pytest_asyncio

from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.builtins.harness import make_config, prompt_texts, ref, run, start

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

LOOKUP = {"lookup": {"description": "Look up.", "result": {"v": 1}}}
CALL = {"toolCalls": [{"name": "lookup", "args": {}}]}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "ensure-final-response", "steering-reminder", "background-work-signals")


async def test_final_step_reminder_only_on_the_last_step(address: str) -> None:
    cfg = make_config(
        address,
        input_processors=[ref("ensure-final-response", max_steps=3)],
        responses=[CALL, CALL, {"text": "summary"}],
        tools=LOOKUP,
        max_steps=3,
    )
    out = await run(cfg, "research", stream=True)
    reminders = [[t for t in prompt_texts(r) if t.startswith("<system-reminder")] for r in out.requests]
    assert reminders[:2] == [[], []]
    assert reminders[2] == [
        '<system-reminder reason="max-steps-reached" step="3">This is your final step (step 3 of 3). '
        "Do not call any more tools. Summarize what you have found and give the user a complete final "
        "answer now.</system-reminder>"
    ]
    signals = [c["data"] for c in out.chunks if c["type"] == "data-signal"]
    assert [s["attributes"] for s in signals] == [{"reason": "max-steps-reached", "step": 3}]


async def test_steering_reminder_is_resent_each_step_and_never_stored(address: str) -> None:
    cfg = make_config(
        address,
        input_processors=[ref("steering-reminder")],
        responses=[CALL, {"text": "done"}],
        tools=LOOKUP,
    )
    out = await run(cfg, "go")
    expected = (
        "<system-reminder>Stay on the current task and keep answers under three sentences.</system-reminder>"
    )
    assert len(out.requests) == 2  # the tool call's step and the answer's: the loop below is not empty
    for request in out.requests:
        texts = prompt_texts(request)
        assert texts.count(expected) == 1  # one fresh copy, near the newest turn
        assert texts[-1] == expected or texts[-2] == expected
    stored = [m for m in out.result.response_messages if m["role"] == "signal"]
    assert stored == []


async def test_background_work_lifecycle_signals(address: str) -> None:
    tools = {
        "research": {
            "result": {"_background": {"taskId": "t1", "disposition": "deferred", "status": "running"}}
        },
        "check": {
            "result": {"_background": {"taskId": "t1", "disposition": "deferred", "status": "completed"}}
        },
    }
    cfg = make_config(
        address,
        output_processors=[ref("background-work-signals")],
        responses=[
            {"toolCalls": [{"name": "research", "args": {}}]},
            {"toolCalls": [{"name": "check", "args": {}}]},
            {"toolCalls": [{"name": "check", "args": {}}]},
            {"text": "finished"},
        ],
        tools=tools,
    )
    out = await run(cfg, "research this", stream=True)
    signals = [c["data"] for c in out.chunks if c["type"] == "data-signal"]
    assert [(s["type"], s["tagName"], s["contents"]) for s in signals] == [
        ("notification", "work-deferred", "work-deferred: call_1"),
        ("notification", "work-completed", "work-completed: call_1"),  # once, though reported twice
    ]
    assert any(
        t == "<work-completed>work-completed: call_1</work-completed>" for t in prompt_texts(out.requests[2])
    )
