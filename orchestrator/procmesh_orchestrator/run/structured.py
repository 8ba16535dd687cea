"""Structured output: the instruction and response format a call's schema adds, and the answer's
parsing and validation (`CallOptions.structured_output`)."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import jsonschema

from procmesh_orchestrator.run.types import StructuredOutput

log = logging.getLogger(__name__)

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(?P<body>.*?)\n?```\s*$", re.DOTALL)


def instruction(so: StructuredOutput) -> str:
    """The system message asking for the JSON value (the schema inlined: every provider reads it)."""
    ask = so.instructions or "Answer with one JSON value that matches this JSON schema, and nothing else."
    return f"{ask}\n{json.dumps(dict(so.schema), ensure_ascii=False)}"


def response_format(so: StructuredOutput) -> dict[str, Any]:
    """The model request's response format (a provider with a JSON-schema mode uses it)."""
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
    if so.error_strategy == "fallback":
        return so.fallback_value, None
    if so.error_strategy == "warn":
        log.warning("%s", error)
        return None, None
    return None, error
