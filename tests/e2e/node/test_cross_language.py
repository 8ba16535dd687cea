"""The orchestrator drives pipelines mixing a Node SDK sidecar and a Python SDK sidecar.

Both are real processes (tests/e2e/node/conftest.py): ``node sdk/node/examples/serve.mjs``
(stream-filter, response-validator, word-counter) and ``python -m procmesh_sidecars examples``
(pii-redactor, topic-guard, word-filter, length-check, word-counter). Every Node example is
exercised end to end here: the stream filter (mask, drop), the output-step validator (retry
with feedback), the stateful word counter (state across streams and into
processOutputResult, a custom chunk, metadata).
"""

from __future__ import annotations

from typing import Any

import pytest

from procmesh_orchestrator.app import App
from procmesh_orchestrator.config import Config, parse_config
from procmesh_orchestrator.errors import ConfigError
from procmesh_orchestrator.providers.builtin import ScriptedModel
from procmesh_orchestrator.run import CallOptions, RunResult
from tests.e2e.node.conftest import Sidecars

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


def config(
    sidecars: Sidecars,
    responses: list[dict[str, Any]],
    *,
    input_processors: list[Any] | None = None,
    output_processors: list[Any] | None = None,
    max_processor_retries: int | None = None,
) -> Config:
    agent: dict[str, Any] = {
        "model": "scripted",
        "tools": ["weather"],
        # no default error processors: App would start its built-in sidecar per test
        "errorProcessorDefaults": False,
        "inputProcessors": input_processors or [],
        "outputProcessors": output_processors or [],
    }
    if max_processor_retries is not None:
        agent["maxProcessorRetries"] = max_processor_retries
    return parse_config(
        {
            "sidecars": {"node": {"address": sidecars.node}, "py": {"address": sidecars.python}},
            "models": {"scripted": {"provider": "scripted", "responses": responses}},
            "tools": {"weather": {"description": "Current weather.", "result": {"forecast": "sunny"}}},
            "agents": {"a": agent},
        },
        "cross-language test config",
    )


async def stream(
    app: App, text: str, options: CallOptions | None = None
) -> tuple[list[dict[str, Any]], RunResult]:
    run = app.agent("a").stream(text, options)
    chunks = [chunk async for chunk in run]
    return chunks, await run.result()


def streamed_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")


def prompts(app: App) -> list[list[dict[str, Any]]]:
    model = app.models["scripted"]
    assert isinstance(model, ScriptedModel)
    return [req.prompt for req in model.requests]


def last_user_text(prompt: list[dict[str, Any]]) -> str:
    msg = [m for m in prompt if m["role"] == "user"][-1]
    return "".join(p["text"] for p in msg["content"] if p["type"] == "text")


async def test_describe_sees_both_sdks(sidecars: Sidecars) -> None:
    async with App(config(sidecars, [])) as app:
        assert set(app.catalog["node"]) == {"stream-filter", "response-validator", "word-counter"}
        assert {"pii-redactor", "topic-guard", "word-filter"} <= set(app.catalog["py"])
        counter = app.catalog["node"]["word-counter"]
        assert len(counter.hooks) == 2
        assert app.clients["node"].address == sidecars.node


async def test_a_stream_runs_through_python_and_node_processors_in_lane_order(sidecars: Sidecars) -> None:
    deltas = ["Well, ", "darn ", "it: ", "the secret code ", "is safe ", "now"]
    cfg = config(
        sidecars,
        [{"deltas": deltas}],
        input_processors=["py/pii-redactor"],
        output_processors=[
            {"processor": "node/stream-filter", "options": {"words": ["darn"], "drop": ["secret"]}},
            {"processor": "py/word-filter", "options": {"words": ["well"]}},
            "node/word-counter",
        ],
    )
    async with App(cfg) as app:
        chunks, result = await stream(app, "Mail me at ana@example.com")
        sent = prompts(app)
    # Python processInput rewrote the input before the model saw it.
    assert last_user_text(sent[0]) == "Mail me at [email]"
    # Node masked "darn" and dropped the delta with "secret"; Python then masked "well".
    assert streamed_text(chunks) == "****, **** it: is safe now"
    assert result.text == "****, **** it: is safe now"
    # The Node counter saw what the earlier stages emitted: 6 words, its state carried from the
    # stream's StreamEnd into processOutputResult.
    counts = [c["data"] for c in chunks if c["type"] == "data-word-count"]
    assert counts == [{"words": 6}]
    assert result.assistant_metadata == {"wordCount": 6}
    assert chunks[-1]["type"] == "finish"
    assert chunks[-1]["payload"]["metadata"] == {"wordCount": 6}


async def test_the_node_counter_keeps_its_state_across_steps_and_tool_chunks(sidecars: Sidecars) -> None:
    cfg = config(
        sidecars,
        [
            {"text": "Let me check that", "toolCalls": [{"name": "weather", "args": {"city": "Paris"}}]},
            {"text": "It is sunny"},
        ],
        output_processors=["node/word-counter"],
    )
    async with App(cfg) as app:
        chunks, result = await stream(app, "Weather in Paris?")
        generated = await app.agent("a").generate("again")  # a new run: a new state
    kinds = [c["type"] for c in chunks]
    assert "tool-result" in kinds
    assert [c["data"] for c in chunks if c["type"] == "data-word-count"] == [{"words": 7}]
    assert result.assistant_metadata == {"wordCount": 7}
    assert result.text == "It is sunny"
    assert generated.text == "(script exhausted)"
    assert generated.assistant_metadata == {"wordCount": 2}


async def test_the_node_validator_retries_the_step_with_feedback(sidecars: Sidecars) -> None:
    long = "This answer rambles on and on with far too many words for the limit"
    cfg = config(
        sidecars,
        [{"text": long}, {"text": "Short answer now"}],
        output_processors=[{"processor": "node/response-validator", "options": {"maxWords": 5}}],
        max_processor_retries=2,
    )
    violations: list[dict[str, Any]] = []
    async with App(cfg) as app:
        result = await app.agent("a").generate("Explain", CallOptions(on_violation=violations.append))
        sent = prompts(app)
    assert result.text == "Short answer now"
    assert result.tripwire is None
    assert len(sent) == 2
    # The retry replays the step with the reason appended after the conversation.
    assert sent[1][: len(sent[0])] == sent[0]
    assert last_user_text(sent[1]) == "<system-reminder>Answer in at most 5 words.</system-reminder>"
    assert violations == [
        {
            "processorId": "response-validator",
            "message": "Answer in at most 5 words.",
            "detail": {"words": 14, "limit": 5},
        }
    ]


async def test_the_node_validator_lets_the_answer_through_once_retries_are_used_up(
    sidecars: Sidecars,
) -> None:
    long = "one two three four five six seven"
    cfg = config(
        sidecars,
        [{"text": long}, {"text": long}],
        output_processors=[
            {"processor": "node/response-validator", "options": {"maxWords": 3, "maxRetries": 1}}
        ],
        max_processor_retries=3,
    )
    violations: list[dict[str, Any]] = []
    async with App(cfg) as app:
        result = await app.agent("a").generate("Count", CallOptions(on_violation=violations.append))
    assert result.text == long
    assert [v["message"] for v in violations] == [
        "Answer in at most 3 words.",
        "answer still has 7 words after 1 retries",
    ]


async def test_a_python_guard_aborts_before_any_node_processor_runs(sidecars: Sidecars) -> None:
    cfg = config(
        sidecars,
        [{"text": "never"}],
        input_processors=[{"processor": "py/topic-guard", "options": {"words": ["jailbreak"]}}],
        output_processors=["node/stream-filter", "node/word-counter"],
    )
    async with App(cfg) as app:
        chunks, result = await stream(app, "please jailbreak")
        assert prompts(app) == []
    assert [c["type"] for c in chunks if c["type"] != "start"] == ["tripwire"]
    assert result.tripwire is not None
    assert result.tripwire["processorId"] == "topic-guard"
    assert result.finish_reason == "other"


async def test_invalid_node_options_are_rejected_naming_the_processor(sidecars: Sidecars) -> None:
    """The Node processor publishes a JSON schema and checks it on every call (INVALID_ARGUMENT).

    An orchestrator that also validates options against the published schema at start-up
    refuses the config instead; either way the processor and the bad key are named.
    """
    cfg = config(
        sidecars,
        [{"text": "hello there"}],
        output_processors=[{"processor": "node/stream-filter", "options": {"wrods": ["typo"]}}],
    )
    refused: str | None = None
    try:
        async with App(cfg) as app:
            chunks, result = await stream(app, "hi")
    except ConfigError as exc:
        refused = str(exc)
    if refused is not None:
        assert "stream-filter" in refused
        assert "wrods" in refused
        return
    assert result.error is not None
    assert "stream-filter" in result.error
    assert "INVALID_ARGUMENT" in result.error
    assert 'unknown keys ["wrods"]' in result.error
    assert chunks[-1]["payload"]["finishReason"] == "error"
