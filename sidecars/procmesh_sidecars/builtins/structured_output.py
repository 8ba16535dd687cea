"""`structured-output`: the final answer must be JSON valid against a JSON Schema.

Output lane: ``processOutputStep`` parses each answering step's text (a step that
calls tools is not an answer) and validates it. Invalid output, by
``error_strategy``: ``strict`` aborts with ``retry=True`` and the validation
errors as feedback (the step is replayed while ``maxProcessorRetries`` allows;
after that the run ends with the tripwire), ``warn`` reports a violation and
lets the text through, ``fallback`` uses ``fallback_value``.
``processOutputResult`` attaches the object to the answer's metadata
(``structuredOutput``, which reaches the result and the ``finish`` chunk) and
emits a ``data-structured-output`` chunk.

Input lane (optional): ``processInputStep`` adds a system instruction with the
schema, so the model knows the expected shape before the first attempt.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, field_validator

from procmesh import Processor
from procmesh_sidecars.builtins._common import Message, js_stringify
from procmesh_sidecars.builtins._linear_re import SPACE, compile_pattern

# On RE2: under `re`'s backtracking this pattern was cubic in the spaces after an opening fence
# (2,000 of them took 6 s). SPACE is the Unicode whitespace `re`'s \s matched.
_FENCE = compile_pattern(
    rf"^[{SPACE}]*```(?:json|JSON)?[{SPACE}]*\n?(.*?)\n?[{SPACE}]*```[{SPACE}]*$", dot_all=True
)
MAX_REPORTED_ERRORS = 5


class StructuredOutputOptions(BaseModel):
    """Options of `structured-output`."""

    schema_: dict[str, Any] = Field(alias="schema")
    """The JSON Schema the answer must satisfy (any draft; ``$schema`` picks it, default 2020-12)."""
    error_strategy: Literal["strict", "warn", "fallback"] = "strict"
    fallback_value: Any = None
    """The object used when the answer is invalid and error_strategy is ``fallback``."""
    instructions: str | None = None
    """The system instruction added in the input lane (default: one naming the schema)."""
    json_prompt_injection: bool = True
    """Input lane: add the instruction at all."""

    model_config = ConfigDict(populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _valid_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            jsonschema.validators.validator_for(value).check_schema(value)
        except SchemaError as exc:
            raise ValueError(f"invalid JSON schema: {exc.message}") from None
        return value


def parse_json(text: str) -> Any:
    """The JSON value in `text`: the whole text, a fenced block, or the outermost object/array."""
    candidates = [text.strip()]
    fenced = _FENCE.match(text)
    if fenced:
        candidates.insert(0, fenced.group(1).strip())
    for open_, close in (("{", "}"), ("[", "]")):
        start, end = text.find(open_), text.rfind(close)
        if 0 <= start < end:
            candidates.append(text[start : end + 1])
    error: json.JSONDecodeError | None = None
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except json.JSONDecodeError as exc:
            error = error or exc
    raise error or json.JSONDecodeError("no JSON value", text, 0)


def validation_errors(value: Any, schema: dict[str, Any]) -> list[str]:
    """Readable validation errors (``$.path: message``), most relevant first."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = sorted(validator.iter_errors(value), key=lambda e: (len(e.path), str(e.path)))
    return [f"{e.json_path}: {e.message}" for e in errors]


class StructuredOutput(Processor):
    """Validates answers against a JSON Schema; asks for a corrected answer when invalid."""

    id = "structured-output"
    name = "Structured Output"
    description = "Validates the answer against a JSON Schema; retries with the errors as feedback."
    Options = StructuredOutputOptions

    async def process_input_step(
        self, system_messages: list[Message], options: StructuredOutputOptions
    ) -> dict[str, Any] | None:
        if not options.json_prompt_injection:
            return None
        text = options.instructions or (
            "Respond with only a JSON value, no prose and no code fences, that matches this JSON Schema:\n"
            + js_stringify(options.schema_)
        )
        instruction = {
            "id": "structured-output-instructions",
            "role": "system",
            "content": {"format": 2, "parts": [{"type": "text", "text": text}]},
        }
        return {"system_messages": [*system_messages, instruction]}

    async def process_output_step(
        self,
        text: str,
        tool_calls: list[dict[str, Any]] | None,
        options: StructuredOutputOptions,
        state: dict[str, Any],
        abort: Any,
        report_violation: Any,
    ) -> None:
        if tool_calls:
            return
        problem: str
        try:
            value = parse_json(text)
        except json.JSONDecodeError as exc:
            problem = f"the answer is not valid JSON ({exc.msg} at position {exc.pos})"
            errors = [problem]
        else:
            errors = validation_errors(value, options.schema_)
            if not errors:
                state["object"] = value
                state.pop("invalid", None)
                return
            problem = "the answer does not match the required JSON Schema"
        shown = errors[:MAX_REPORTED_ERRORS]
        detail = {"errors": shown, "errorCount": len(errors)}
        if options.error_strategy == "strict":
            abort(
                f"Structured output: {problem}: "
                + "; ".join(shown)
                + ". Reply again with only a JSON value that matches this schema: "
                + js_stringify(options.schema_),
                retry=True,
                metadata=detail,
            )
        report_violation(f"Structured output: {problem}", detail)
        state.pop("object", None)
        state["invalid"] = True

    async def process_output_result(
        self, messages: list[Message], options: StructuredOutputOptions, state: dict[str, Any], writer: Any
    ) -> list[Message] | None:
        if "object" in state:
            obj = state["object"]
        elif state.get("invalid") and options.error_strategy == "fallback":
            obj = options.fallback_value
        else:
            return None
        await writer.custom({"type": "data-structured-output", "data": {"object": obj}})
        out = []
        tagged = False
        for msg in reversed(messages):  # the answer is the last assistant message
            if not tagged and msg.get("role") == "assistant":
                meta = {**((msg.get("content") or {}).get("metadata") or {}), "structuredOutput": obj}
                msg = {**msg, "content": {**msg["content"], "metadata": meta}}
                tagged = True
            out.append(msg)
        return list(reversed(out)) if tagged else None
