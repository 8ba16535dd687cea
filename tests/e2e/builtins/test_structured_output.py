"""structured-output through a real `procmesh-sidecar structured-output` process and the agent loop."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import pytest_asyncio

from procmesh_orchestrator.errors import ProcessorFailedError
from procmesh_orchestrator.sidecar_process import SidecarProcess
from tests.e2e.builtins.harness import make_config, prompt_texts, ref, run, start

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "number"}},
    "required": ["city", "celsius"],
    "additionalProperties": False,
}
GOOD = {"city": "Paris", "celsius": 21}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def address(start_sidecar: Callable[..., SidecarProcess]) -> str:
    return await start(start_sidecar, "structured-output")


async def test_valid_answer_reaches_metadata_and_stream(address: str) -> None:
    so = ref("structured-output", schema=SCHEMA)
    cfg = make_config(
        address,
        input_processors=[so],
        output_processors=[so],
        responses=[{"text": "```json\n" + json.dumps(GOOD) + "\n```"}],
    )
    out = await run(cfg, "weather?", stream=True)
    assert any(
        "matches this JSON Schema" in t for t in prompt_texts(out.requests[0])
    )  # input-lane instruction
    assert out.result.assistant_metadata["structuredOutput"] == GOOD
    data = [c for c in out.chunks if c["type"] == "data-structured-output"]
    assert data == [{"type": "data-structured-output", "data": {"object": GOOD}}]
    assert out.chunks[-1]["payload"]["metadata"]["structuredOutput"] == GOOD


async def test_invalid_answer_is_retried_with_the_errors_as_feedback(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("structured-output", schema=SCHEMA)],
        responses=[{"text": '{"city": "Paris", "celsius": "warm"}'}, {"text": json.dumps(GOOD)}],
        max_processor_retries=2,
    )
    out = await run(cfg, "weather?")
    assert out.result.text == json.dumps(GOOD)
    assert len(out.requests) == 2
    feedback = prompt_texts(out.requests[1])[-1]
    assert feedback.startswith("<system-reminder>Structured output: the answer does not match")
    assert "$.celsius: 'warm' is not of type 'number'" in feedback


async def test_not_json_after_the_budget_is_a_tripwire(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("structured-output", schema=SCHEMA)],
        responses=[{"text": "It is sunny."}, {"text": "Still prose."}],
        max_processor_retries=1,
    )
    out = await run(cfg, "weather?")
    trip = out.result.tripwire
    assert trip is not None
    assert trip["processorId"] == "structured-output"
    assert trip["reason"].startswith("Structured output: the answer is not valid JSON")
    assert len(out.requests) == 2


@pytest.mark.parametrize(
    ("strategy", "expected"), [("warn", None), ("fallback", {"city": "unknown", "celsius": 0})]
)
async def test_warn_and_fallback(address: str, strategy: str, expected: object) -> None:
    options = {
        "schema": SCHEMA,
        "error_strategy": strategy,
        "fallback_value": {"city": "unknown", "celsius": 0},
    }
    cfg = make_config(
        address, output_processors=[ref("structured-output", **options)], responses=[{"text": "{}"}]
    )
    out = await run(cfg, "weather?")
    assert out.result.tripwire is None
    assert out.result.text == "{}"
    assert out.result.assistant_metadata.get("structuredOutput") == expected
    assert out.result.violations[0]["detail"]["errors"] == [
        "$: 'city' is a required property",
        "$: 'celsius' is a required property",
    ]


async def test_tool_calling_steps_are_not_validated(address: str) -> None:
    cfg = make_config(
        address,
        output_processors=[ref("structured-output", schema=SCHEMA)],
        responses=[
            {"text": "checking", "toolCalls": [{"name": "lookup", "args": {}}]},
            {"text": json.dumps(GOOD)},
        ],
        tools={"lookup": {"result": 1}},
    )
    out = await run(cfg, "weather?")
    assert out.result.tripwire is None
    assert out.result.assistant_metadata["structuredOutput"] == GOOD


async def test_an_invalid_schema_is_an_options_error(address: str) -> None:
    cfg = make_config(address, output_processors=[ref("structured-output", schema={"type": "nope"})])
    with pytest.raises(ProcessorFailedError, match="invalid JSON schema"):
        await run(cfg)
