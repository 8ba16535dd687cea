"""The tool calls of one model step run at the same time (SEED-GAPS P8), over a real tool sidecar.

Each ``meet`` call waits inside the sidecar until its partner call has started: one at a time, the
first would wait for ever (its tool timeout cuts it), so the two finishing proves they overlapped.
The first call also waits for the second to finish, so the results coming back in the model's
order proves the order is kept, not the order the tools finished in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from tests.e2e.tools.harness import call, collect, config, of_type, prompts, tool_outputs

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


def meeting(py_tools: str, where: Path, **agent: Any) -> Any:
    calls = [
        call("meet", dir=str(where), me="first", other="second", waitDone=True),
        call("meet", dir=str(where), me="second", other="first"),
    ]
    return config(
        sidecars={"py": {"address": py_tools, "timeout": 30}},
        tools={"meet": {"sidecar": "py", "timeout": 2, "onFailure": "fail-open"}},
        responses=[{"toolCalls": calls}, {"text": "met"}],
        **agent,
    )


async def test_two_slow_sidecar_calls_overlap_and_come_back_in_the_models_order(
    py_tools: str, tmp_path: Path
) -> None:
    async with App(meeting(py_tools, tmp_path, toolCallConcurrency=2)) as app:
        chunks, result = await collect(app)
        sent = prompts(app)
    assert result.status == "success", result.error
    assert of_type(chunks, "tool-error") == []
    # "second" finished first (the first call waited for its done file), yet comes second
    assert [r["result"] for r in of_type(chunks, "tool-result")] == ["first", "second"]
    assert [r["result"] for r in result.steps[0]["toolResults"]] == ["first", "second"]
    assert list(tool_outputs(sent[1]).values()) == ["first", "second"]


async def test_with_a_bound_of_one_the_calls_run_one_by_one(py_tools: str, tmp_path: Path) -> None:
    async with App(meeting(py_tools, tmp_path, toolCallConcurrency=1)) as app:
        chunks, result = await collect(app)
    assert result.status == "success", result.error
    # the first call waited alone until its timeout; only then did the second start (and met
    # the first's start file, so it could finish)
    [error] = of_type(chunks, "tool-error")
    assert error["toolCallId"] == "call_1"
    assert [r["result"] for r in of_type(chunks, "tool-result")] == ["second"]
    assert not (tmp_path / "first.done").exists()
