"""Replay's pieces that need no process: the decision diff (matched by where each decision was
made, the nth for retries; a pass only one side made is no change; a stopped replay compares only
what it can know) and the recorded model (the recorded output while the prompt is the recorded
one, a stop naming the step otherwise)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from procmesh_orchestrator.replay.diff import compared, diff
from procmesh_orchestrator.replay.recorded import RecordedModel, RecordedModels, RecordedTool, ReplayStopped
from procmesh_orchestrator.replay.source import RecordedRun
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.run.tools import ToolCall
from procmesh_orchestrator.store.decisions import Decision

IN, OUT, STEP = "process_input", "process_output_stream", "process_output_step"


def _d(
    entry: str, hook: str, step: int, outcome: str, *, part: int | None = None, would: str = ""
) -> Decision:
    return Decision("r", "a", entry, "guards", entry, hook, step, outcome, "", part=part, would=would)


def _changes(recorded: list[Decision], candidate: list[Decision], stop: int | None = None) -> list[Any]:
    return [(c.step, c.entry, c.recorded, c.candidate) for c in diff(*compared(recorded, candidate, stop))]


def test_outcomes_are_compared_where_each_decision_was_made() -> None:
    recorded = [
        _d("guard", IN, 0, "pass"),
        _d("filter", OUT, 0, "pass", part=0),
    ]
    same = [_d("filter", OUT, 0, "pass", part=0), _d("guard", IN, 0, "pass")]
    assert _changes(recorded, same) == []
    masked = [
        _d("guard", IN, 0, "pass"),
        _d("filter", OUT, 0, "rewrite", part=0),
    ]
    assert _changes(recorded, masked) == [(0, "filter", "pass", "rewrite")]
    monitor = [_d("guard", IN, 0, "monitor", would="abort")]
    assert _changes([_d("guard", IN, 0, "monitor", would="pass")], monitor) == [
        (0, "guard", "monitor:pass", "monitor:abort")
    ]


def test_a_pass_only_one_side_made_is_no_change_but_an_abort_is() -> None:
    recorded = [
        _d("guard", IN, 0, "pass"),
        _d("filter", OUT, 1, "pass", part=0),
    ]
    blocked = [_d("guard", IN, 0, "pass"), _d("new", IN, 0, "abort")]
    assert _changes(recorded, blocked) == [(0, "new", None, "abort")]
    assert _changes(recorded, [*recorded, _d("new", IN, 0, "pass")]) == []


def test_a_decision_made_again_by_a_retry_is_matched_with_its_nth() -> None:
    recorded = [_d("len", STEP, 0, "retry"), _d("len", STEP, 0, "pass")]
    assert _changes(recorded, list(recorded)) == []
    assert _changes(recorded, [*recorded[:1], _d("len", STEP, 0, "retry")]) == [(0, "len", "pass", "retry")]


def test_a_stopped_replay_compares_only_what_it_can_know() -> None:
    recorded = [
        _d("guard", IN, 0, "pass"),
        _d("filter", OUT, 1, "rewrite", part=0),
        _d("guard", IN, 2, "abort"),
    ]
    candidate = [
        _d("guard", IN, 0, "pass"),
        _d("redactor", "process_input_step", 1, "rewrite"),  # made before the step's model call
        _d("guard", IN, 2, "pass"),  # after the stop: not compared
    ]
    # at step 1 the recorded rewrite is one the candidate never got to: not known to change
    assert _changes(recorded, candidate, stop=1) == [(1, "redactor", None, "rewrite")]


def _run(prompt: list[dict[str, Any]], chunks: list[dict[str, Any]]) -> RecordedRun:
    request = ModelRequest(prompt=prompt)
    return RecordedRun("r", "a", [], input="hi", prompts=[(0, request.digest())], outputs=[(0, chunks)])


async def _read(
    model: RecordedModel, request: ModelRequest, seen: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    seen = [] if seen is None else seen
    async for chunk in model.stream(request):
        seen.append(chunk)
    return seen


PROMPT = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
ANSWER = [{"type": "text-delta", "payload": {"text": "hello"}}, {"type": "finish", "payload": {}}]


async def test_the_recorded_model_answers_the_recorded_prompt_with_the_recorded_output() -> None:
    model = RecordedModel(_run(PROMPT, ANSWER), "m")
    assert await _read(model, ModelRequest(prompt=PROMPT, streaming=False)) == ANSWER  # how it streams aside
    with pytest.raises(ReplayStopped) as more:
        await _read(model, ModelRequest(prompt=PROMPT))
    assert "the recorded run made no model call 2" in more.value.reason
    assert model.stopped is more.value


async def test_another_prompt_stops_the_run_at_that_step() -> None:
    model = RecordedModel(_run(PROMPT, ANSWER), "m")
    other = [{"role": "user", "content": [{"type": "text", "text": "[email]"}]}]
    with pytest.raises(ReplayStopped) as stopped:
        await _read(model, ModelRequest(prompt=other))
    assert stopped.value.step == 0
    assert stopped.value.reason.startswith("recorded model output no longer applies from step 0")
    offered = ModelRequest(prompt=PROMPT, tools=[{"name": "weather", "description": "", "inputSchema": {}}])
    with pytest.raises(ReplayStopped):  # tools the recorded run was not offered change the prompt too
        await _read(RecordedModel(_run(PROMPT, ANSWER), "m"), offered)


async def test_an_output_the_recorded_run_stopped_reading_stops_the_replay_where_it_ends() -> None:
    model = RecordedModel(_run(PROMPT, ANSWER[:1]), "m")
    seen: list[dict[str, Any]] = []
    with pytest.raises(ReplayStopped) as stopped:
        await _read(model, ModelRequest(prompt=PROMPT), seen)
    assert seen == ANSWER[:1]
    assert "ends here" in stopped.value.reason


def test_a_processors_model_switch_gets_the_recorded_model_where_the_candidate_resolves_it() -> None:
    model = RecordedModel(_run(PROMPT, ANSWER), "m")
    models = RecordedModels({"fast": RecordedModel(_run(PROMPT, ANSWER), "fast")}, model)
    assert models.get("fast") is model
    assert models["fast"] is model
    assert models.get("unknown") is None  # as the candidate's registry answers it: the run fails alike


async def test_a_tool_call_gets_the_tools_recorded_answer_an_error_too() -> None:
    answered = {"toolCallId": "c1", "toolName": "weather", "args": {"city": "Paris"}, "error": "down"}
    run = RecordedRun("r", "a", [], input="hi", tool_results={"c1": answered})
    model = RecordedModel(run, "m")
    schema = {"type": "object"}
    tool = RecordedTool("weather", "The weather.", schema, False, model)
    at_step = SimpleNamespace(info=SimpleNamespace(step_number=1))
    outcome = await tool.execute(at_step, ToolCall("c1", "weather", {"city": "Paris"}), _no_writer)  # type: ignore[arg-type]
    assert (outcome.result, outcome.error) == (None, "down")
    with pytest.raises(ReplayStopped) as other:
        await tool.execute(at_step, ToolCall("c1", "weather", {"city": "Rome"}), _no_writer)  # type: ignore[arg-type]
    assert (other.value.step, other.value.reason) == (
        1,
        "tool call 'c1' (weather): other arguments than recorded",
    )


async def _no_writer(chunk: dict[str, Any]) -> None:
    raise AssertionError("a recorded tool writes nothing")
