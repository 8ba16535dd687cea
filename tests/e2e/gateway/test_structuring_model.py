"""Structured output with a structuring model, through a real orchestrator process.

The agent's scripted model answers in prose; ``structuredOutput.model`` names a second scripted
model that turns the answer into the schema, streaming its JSON in pieces. The stream carries
the partial objects as ``object`` chunks, then ``object-result``, then ``finish`` (the reference's
structured-output processor); the result's ``object`` is the validated value; a structuring
answer that is not the schema follows the error strategy; under ``strict`` it is the
structured-output processor's processOutputStep abort with retry (SEED-GAPS Q4): retried under
``maxProcessorRetries``, else the run ends in a tripwire.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.e2e.service.conftest import OrchestratorProcess
from tests.integration.service.support import API_KEYS, AUTH

pytestmark = pytest.mark.e2e

PROSE = "It is sunny in Paris today, 21 degrees."
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
    "required": ["city", "celsius"],
}
PIECES = ['{"city": "Pa', 'ris", "celsius": 2', "1}"]


@pytest.fixture(scope="module")
def orchestrator(start_orchestrator: Callable[..., OrchestratorProcess]) -> OrchestratorProcess:
    config: dict[str, Any] = {
        "models": {
            "main": {"provider": "scripted", "responses": [{"text": PROSE}] * 20},
            "structurer": {"provider": "scripted", "responses": [{"deltas": PIECES}] * 10},
            "rambler": {"provider": "scripted", "responses": [{"text": "Paris, I think."}] * 10},
            # off the schema, then on it: a retried step gets it right
            "flaky": {"provider": "scripted", "responses": [{"text": "Paris?"}, {"deltas": PIECES}] * 5},
        },
        "agents": {"weather": {"model": "main", "errorProcessorDefaults": False}},
    }
    return start_orchestrator(config, env={"PROCMESH_API_KEYS": API_KEYS})


def _call(orchestrator: OrchestratorProcess, route: str, **structured: Any) -> httpx.Response:
    body = {"messages": "Weather in Paris?", "structuredOutput": {"schema": SCHEMA, **structured}}
    return httpx.post(f"{orchestrator.http_url}/api/agents/weather/{route}", json=body, headers=AUTH)


def _chunks(response: httpx.Response) -> list[dict[str, Any]]:
    return [
        json.loads(line[len("data: ") :])
        for line in response.text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


def test_the_structuring_model_turns_the_answer_into_the_schema(orchestrator: OrchestratorProcess) -> None:
    body = _call(orchestrator, "generate", model="structurer").json()
    assert body["status"] == "success", body
    assert body["text"] == PROSE, "the agent's model answered freely"
    assert body["object"] == {"city": "Paris", "celsius": 21}


def test_the_stream_carries_partial_objects_then_the_result_before_finish(
    orchestrator: OrchestratorProcess,
) -> None:
    chunks = _chunks(_call(orchestrator, "stream", model="structurer"))
    kinds = [c["type"] for c in chunks]
    tail = [k for k in kinds if k in ("step-finish", "object", "object-result", "finish")]
    assert tail == ["step-finish", "object", "object", "object", "object-result", "finish"]
    partials = [c["object"] for c in chunks if c["type"] == "object"]
    assert partials == [{"city": "Pa"}, {"city": "Paris", "celsius": 2}, {"city": "Paris", "celsius": 21}]
    assert all(c["metadata"] == {"from": "structured-output"} for c in chunks if c["type"] == "object")
    (result,) = [c for c in chunks if c["type"] == "object-result"]
    assert result["object"] == {"city": "Paris", "celsius": 21}
    text = "".join(c["payload"]["text"] for c in chunks if c["type"] == "text-delta")
    assert text == PROSE


@pytest.mark.parametrize(
    ("strategy", "status", "obj"),
    [("strict", "tripwire", None), ("warn", "success", None), ("fallback", "success", {"city": "?"})],
)
def test_a_structuring_answer_off_the_schema_follows_the_error_strategy(
    orchestrator: OrchestratorProcess, strategy: str, status: str, obj: Any
) -> None:
    extra = {"fallbackValue": {"city": "?"}} if strategy == "fallback" else {}
    body = _call(orchestrator, "generate", model="rambler", errorStrategy=strategy, **extra).json()
    assert body["status"] == status
    assert body["object"] == obj
    if strategy == "strict":  # no maxProcessorRetries: the processor's abort ends the run
        assert body["finishReason"] == "other"
        tripwire = body["tripwire"]
        assert (tripwire["processorId"], tripwire["retry"]) == ("structured-output", True)
        assert tripwire["reason"].startswith(
            "[StructuredOutputProcessor] Structuring failed: structured output: the answer is not JSON"
        )
        assert tripwire["metadata"]["error"].startswith("structured output: the answer is not JSON")


def test_a_strict_structuring_failure_retries_the_step_under_max_processor_retries(
    orchestrator: OrchestratorProcess,
) -> None:
    body = {
        "messages": "Weather in Paris?",
        "maxProcessorRetries": 1,
        "structuredOutput": {"schema": SCHEMA, "model": "flaky"},
    }
    response = httpx.post(f"{orchestrator.http_url}/api/agents/weather/generate", json=body, headers=AUTH)
    result = response.json()
    assert result["status"] == "success", result
    assert result["object"] == {"city": "Paris", "celsius": 21}
    first, second = result["steps"]  # the agent's model answered twice: the step ran again
    assert first["tripwire"]["processorId"] == "structured-output"
    assert first["tripwire"]["retry"] is True
    assert second["tripwire"] is None


def test_an_unknown_structuring_model_fails_the_run_naming_it(orchestrator: OrchestratorProcess) -> None:
    body = _call(orchestrator, "generate", model="nope").json()
    assert body["status"] == "failed"
    assert body["error"] == "structured output: unknown structuring model 'nope'"


def test_a_structuring_model_that_is_not_a_reference_is_a_400(orchestrator: OrchestratorProcess) -> None:
    response = _call(orchestrator, "generate", model={"id": "x"})
    assert response.status_code == 400
    assert "structuredOutput.model: give the structuring model as a reference" in response.json()["error"]
