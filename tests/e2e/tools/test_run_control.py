"""Run control end to end: stopWhen ends the loop where it should; aborting a streamed run at any
point, through a real sidecar pipeline, ends it at once with what was streamed and leaves nothing
running on the sidecar.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.run import CallOptions, RunResult
from procmesh_orchestrator.run.messages import message_text
from tests.e2e.tools.harness import Chunk, call, collect, config, of_type, prompts, settled_inflight

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


def weather_config(py_tools: str, responses: list[dict[str, Any]], **agent: Any) -> Any:
    return config(
        sidecars={"py": {"address": py_tools, "timeout": 5}},
        tools={"weather": {"sidecar": "py"}, "finish": {"result": "finished"}},
        responses=responses,
        maxSteps=10,
        **agent,
    )


def weather_calls(*cities: str) -> list[dict[str, Any]]:
    return [{"text": f"checking {c}", "toolCalls": [call("weather", city=c)]} for c in cities]


# -- stopWhen --------------------------------------------------------------------------------


async def test_step_count_is_stops_after_that_many_steps(py_tools: str) -> None:
    cfg = weather_config(py_tools, weather_calls("A", "B", "C", "D"), stopWhen=[{"stepCountIs": 2}])
    async with App(cfg) as app:
        chunks, result = await collect(app)
        asked = len(prompts(app))
    assert result.status == "success", result.error
    assert asked == 2
    assert len(result.steps) == 2
    assert result.finish_reason == "tool-calls"
    # the second step's tool work was done before the loop stopped
    assert [r["result"]["city"] for r in of_type(chunks, "tool-result")] == ["A", "B"]


async def test_has_tool_call_stops_after_the_step_that_called_it(py_tools: str) -> None:
    responses = [
        *weather_calls("A"),
        {"text": "wrapping up", "toolCalls": [call("finish")]},
        *weather_calls("C"),
    ]
    cfg = weather_config(py_tools, responses, stopWhen=[{"hasToolCall": "finish"}])
    async with App(cfg) as app:
        chunks, result = await collect(app)
        asked = len(prompts(app))
    assert result.status == "success", result.error
    assert asked == 2
    assert [s["toolCalls"][0]["toolName"] for s in result.steps] == ["weather", "finish"]
    assert [r["result"] for r in of_type(chunks, "tool-result")][-1] == "finished"


async def test_a_callable_per_call_replaces_the_agents_conditions(py_tools: str) -> None:
    seen: list[int] = []

    def reached_oslo(steps: list[dict[str, Any]]) -> bool:
        seen.append(len(steps))
        return any(r["result"]["city"] == "Oslo" for r in steps[-1]["toolResults"])

    cfg = weather_config(py_tools, weather_calls("Paris", "Oslo", "Rome"), stopWhen=[{"stepCountIs": 1}])
    async with App(cfg) as app:
        result = await app.agent("a").generate("hi", CallOptions(stop_when=[reached_oslo]))
        asked = len(prompts(app))
    assert asked == 2
    assert seen == [1, 2]  # asked after each step, with the steps so far
    assert [s["toolResults"][0]["result"]["city"] for s in result.steps] == ["Paris", "Oslo"]


# -- abort -----------------------------------------------------------------------------------

RUNS = 100
BATCH = 10
WORDS = "one two three four five six"


def abort_config(py_tools: str) -> Any:
    # Every response alike (concurrent runs share the scripted model): six deltas 3 ms apart, then
    # a 30 ms tool call; two steps. Each text delta also waits 2 ms in the `pipe` processor.
    response = {"text": WORDS, "toolCalls": [call("slow", seconds=0.03)]}
    return config(
        sidecars={"py": {"address": py_tools, "timeout": 5}},
        tools={"slow": {"sidecar": "py"}},
        model={"provider": "scripted", "delayMs": 3, "responses": [response] * (2 * RUNS)},
        maxSteps=2,
        outputProcessors=[{"processor": "py/pipe", "options": {"delay": 0.002}}],
    )


def step_texts(chunks: list[Chunk]) -> list[str]:
    """The text each step streamed, from the chunks the caller received."""
    texts: list[str] = []
    for chunk in chunks:
        if chunk["type"] == "step-start":
            texts.append("")
        elif chunk["type"] == "text-delta":
            texts[-1] += chunk["payload"]["text"]
    return texts


async def aborted_run(app: App, rng: random.Random) -> tuple[list[Chunk], RunResult]:
    """One streamed run, aborted after a random delay by `RunStream.cancel()` or its own signal."""
    signal = asyncio.Event() if rng.random() < 0.5 else None
    delay = rng.uniform(0.0, 0.12)
    stream = app.agent("a").stream("hi", CallOptions(abort_signal=signal))
    chunks: list[Chunk] = []

    async def read() -> None:
        async for chunk in stream:
            chunks.append(chunk)

    async with asyncio.timeout(20):  # a run that hangs fails here
        reader = asyncio.create_task(read())
        await asyncio.sleep(delay)
        if signal is not None:
            signal.set()
            result = await stream.result()
        else:
            result = await stream.cancel()
        await reader
    return chunks, result


async def test_100_runs_aborted_at_random_points_end_cleanly(py_tools: str) -> None:
    rng = random.Random(1616)
    outcomes: list[tuple[list[Chunk], RunResult]] = []
    async with App(abort_config(py_tools)) as app:
        for _ in range(RUNS // BATCH):
            outcomes += await asyncio.gather(*(aborted_run(app, rng) for _ in range(BATCH)))
    statuses = [result.status for _, result in outcomes]
    assert set(statuses) <= {"aborted", "success"}, statuses
    assert statuses.count("aborted") >= RUNS // 2, "the delays should abort most runs mid-way"
    for chunks, result in outcomes:
        kinds = [c["type"] for c in chunks]
        assert kinds[-1] == ("abort" if result.status == "aborted" else "finish"), kinds
        assert result.error is None
        streamed = [t for t in step_texts(chunks) if t]
        kept = [message_text(m) for m in result.response_messages if m["role"] == "assistant"]
        # what the caller was sent is what the result keeps: each step's text once, nothing more
        assert [t for t in kept if t] == streamed, (kinds, kept)
        assert result.text == (streamed[-1] if streamed else "")
        assert "".join(streamed) == "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
    # every cancelled tool call and stream part stopped on the sidecar too
    inflight = await settled_inflight(py_tools)
    assert inflight.get("slow") == 0
    assert inflight.get("pipe") == 0
