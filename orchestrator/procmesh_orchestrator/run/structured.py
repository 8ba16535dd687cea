"""Structured output: the instruction and response format a call's schema adds, and the answer's
parsing and validation (`CallOptions.structured_output`).

With a structuring `StructuredOutput.model`, the agent's model answers freely and a second call,
after the run's last step, turns the answer (its text, tool calls and results) into the schema, as
the reference's structured-output processor does: that call's partial JSON streams as ``object``
chunks, then the validated value as ``object-result``, before the run's ``finish``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import TYPE_CHECKING, Any

import jsonschema
import pydantic_core

from procmesh import tracing
from procmesh_orchestrator.errors import APICallError, TripwireAbort
from procmesh_orchestrator.run.framework.cost import CostLimitError
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.run.types import StructuredOutput

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore

log = logging.getLogger(__name__)

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(?P<body>.*?)\n?```\s*$", re.DOTALL)
_OPENING_FENCE = re.compile(r"^\s*```(?:json)?\s*")
_STRUCTURING_ASK = (
    "Extract and structure the key information from the following text according to the specified "
    "schema. Keep the original meaning and details. Rely on the provided text and conversation "
    "history.\n\n"
)
PROCESSOR_ID = "structured-output"
"""The reference's id for the processor a structuring model stands for (chunks, tripwires)."""
_FROM = {"from": PROCESSOR_ID}


def for_agent(so: StructuredOutput | None) -> StructuredOutput | None:
    """The structured output the agent's own model answers (none when a structuring model does)."""
    return so if so is not None and so.model is None else None


def instruction(so: StructuredOutput) -> str:
    """The system message asking for the JSON value (the schema inlined: every provider reads it)."""
    ask = so.instructions or "Answer with one JSON value that matches this JSON schema, and nothing else."
    return f"{ask}\n{json.dumps(dict(so.schema), ensure_ascii=False)}"


def offered_tools(
    tools: list[dict[str, Any]], tool_choice: Any, answered: StructuredOutput | None
) -> list[dict[str, Any]]:
    """The tool definitions a step sends: with ``toolChoice: 'none'`` they are still sent (the
    conversation's earlier calls and results stay meaningful to the model), unless the step also
    sends a structured-output schema, which asks for the JSON value alone: then none are (the
    processors seed, on processInputStep's ``toolChoice``)."""
    return [] if tool_choice == "none" and answered is not None else tools


def response_format(so: StructuredOutput) -> dict[str, Any] | None:
    """The model request's response format (a provider with a JSON-schema mode uses it); None with
    `StructuredOutput.json_prompt_injection`, as the reference sends none then: the schema reaches
    the model in the prompt alone (`instruction`, `structuring_instructions`)."""
    if so.json_prompt_injection:
        return None
    return {"type": "json", "schema": dict(so.schema), "name": "response"}


def parse(text: str, so: StructuredOutput) -> tuple[Any, str | None]:
    """The answer as its JSON value, and the error (None: it matches the schema).

    With ``warn`` the error is logged and the object is None; with ``fallback`` the object is the
    fallback value; with ``strict`` the caller fails the run with the error.
    """
    fenced = _FENCE.match(text)
    raw = fenced["body"] if fenced else text
    error: str | None = None
    value: Any = None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        error = f"structured output: the answer is not JSON ({exc})"
    else:
        try:
            jsonschema.validators.validator_for(so.schema)(so.schema).validate(value)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
            error = f"structured output: the answer does not match the schema at {where}: {exc.message}"
    if error is None:
        return value, None
    return parse_failure(error, so)


def structuring_instructions(so: StructuredOutput) -> str:
    """The structuring model's system message (the reference's, with the schema inlined)."""
    if so.instructions:
        return so.instructions
    schema = json.dumps(dict(so.schema), indent=2, ensure_ascii=False)
    return (
        "You are a data structuring specialist. Your job is to convert unstructured text into a "
        "specific JSON format.\n\nTASK: Convert the provided unstructured text into valid JSON that "
        f"matches the following schema:\n{schema}\n\nREQUIREMENTS:\n"
        "- Return ONLY valid JSON, no additional text or explanation\n"
        "- Extract relevant information from the input text\n"
        "- If information is missing, use reasonable defaults or null values\n"
        "- Maintain data types as specified in the schema\n"
        "- Be consistent and accurate in your conversions\n\n"
        "The input text may be in any format (sentences, bullet points, paragraphs, etc.). Extract "
        "the relevant data and structure it according to the schema."
    )


def structuring_input(steps: list[dict[str, Any]], text: str) -> str:
    """What the structuring model reads: the run's tool calls, their results and its answer, in
    the reference's sections."""
    calls = [c for step in steps for c in step.get("toolCalls") or []]
    results = [r for step in steps for r in step.get("toolResults") or []]
    sections: list[str] = []
    if calls:
        body = "\n".join(
            f"## {c.get('toolName')}\n### Input: {json.dumps(c.get('args'), ensure_ascii=False)}"
            "\n### Output: "
            for c in calls
        )
        sections.append(f"# Tool Calls\n{body}")
    if results:
        body = "\n".join(
            f"{r.get('toolName')}: {json.dumps(r.get('result'), indent=2, ensure_ascii=False)}"
            for r in results
        )
        sections.append(f"# Tool Results\n{body}")
    if text:
        sections.append(f"# Assistant Response\n{text}")
    return "\n\n".join(sections)


async def answer(run: RunCore, text: str, so: StructuredOutput) -> tuple[Any, str | None]:
    """The run's object: its answer parsed, or (with `StructuredOutput.model`) structured by a
    second model call whose partial objects stream as ``object`` chunks. Errors as `parse`."""
    strict = dataclasses.replace(so, error_strategy="strict")  # the mismatch, before the strategy
    if so.model is None:
        value, problem = parse(text, strict)
    else:
        structured, problem = await _structure(run, text, so)
        if problem is None:
            value, problem = parse(structured, strict)
    if problem is None:
        return value, None
    run.used_fallback_value = so.error_strategy == "fallback"  # the result's usedFallbackValue
    return parse_failure(problem, so)


def step_abort(error: str) -> TripwireAbort:
    """A strict structuring failure as the structured-output processor's processOutputStep abort
    (its reason and metadata as the reference words them): retried under maxProcessorRetries."""
    return TripwireAbort(
        PROCESSOR_ID,
        f"[StructuredOutputProcessor] Structuring failed: {error}",
        True,
        {"error": error},
        "process_output_step",
    )


def parse_failure(error: str, so: StructuredOutput) -> tuple[Any, str | None]:
    """What a structuring failure gives under the error strategy (as a mismatch in `parse`)."""
    if so.error_strategy == "fallback":
        return so.fallback_value, None
    if so.error_strategy == "warn":
        log.warning("%s", error)
        return None, None
    return None, error


async def _structure(run: RunCore, text: str, so: StructuredOutput) -> tuple[str, str | None]:
    """Call the structuring model; its text, or why there is none."""
    assert so.model is not None
    model = run.agent.models.get(so.model)
    if model is None:
        return "", f"structured output: unknown structuring model {so.model!r}"
    prompt: list[dict[str, Any]] = [
        {"role": "system", "content": structuring_instructions(so)},
        {
            "role": "user",
            "content": [{"type": "text", "text": _STRUCTURING_ASK + structuring_input(run.steps, text)}],
        },
    ]
    request = ModelRequest(prompt=prompt, streaming=run.streaming, response_format=response_format(so))
    reservation = None
    if run.cost is not None:
        try:
            reservation = await run.cost.reserve(model.model_id, prompt)
        except CostLimitError as exc:
            return "", f"structured output: {exc}"
    metrics = run.metrics
    received: list[str] = []
    usage: dict[str, Any] = {}
    last: Any = None
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model.model_id}
    with tracing.span(f"chat {model.model_id}", kind="client", attributes=attributes):
        try:
            async for chunk in model.stream(request):
                payload = chunk.get("payload") or {}
                if chunk["type"] == "finish":
                    usage = payload.get("usage") or {}
                elif chunk["type"] == "text-delta":
                    received.append(str(payload.get("text", "")))
                    partial = _partial("".join(received))
                    if partial is not None and partial != last:
                        last = partial
                        run.emit({"type": "object", "object": partial, "metadata": dict(_FROM)})
        except APICallError as exc:
            metrics.model_calls.labels(model.model_id, "error").inc()
            if reservation is not None and run.cost is not None:
                await run.cost.release(reservation)
            return "", f"structured output: the structuring model {model.model_id!r} failed: {exc}"
    metrics.model_calls.labels(model.model_id, "ok").inc()
    for direction, key in (("input", "inputTokens"), ("output", "outputTokens")):
        metrics.model_tokens.labels(model.model_id, direction).inc(int(usage.get(key) or 0))
    if reservation is not None and run.cost is not None:
        await run.cost.settle(reservation, usage)
    return "".join(received), None


def _partial(text: str) -> Any:
    """The value a partial JSON answer holds so far (None: nothing parseable yet)."""
    try:
        return pydantic_core.from_json(
            _OPENING_FENCE.sub("", text, count=1), allow_partial="trailing-strings"
        )
    except ValueError:
        return None
