"""One judge call for several guards: the merged prompt and schema, and each guard's section of the answer.

A guard asking the gateway for a typed verdict with a `section` (proto ``JudgeSection``) says what
it judges (`SectionRequest.content`), its instructions, its question and its answer's schema.
Several such questions about the same content become one call (`judge_planner`): a system message
with one part per guard, the content once, and an object schema with one property per guard whose
value is that guard's own schema. The answer is split back (`split`), each section checked against
its own schema, so one guard's malformed section is only that guard's problem.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import jsonschema

from procmesh import convert
from procmesh.v1 import model_pb2 as mpb

_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(?P<body>.*?)\n?```\s*$", re.DOTALL)
_NAME = re.compile(r"[^A-Za-z0-9_-]")


class Refused(Exception):
    """A gateway call refused or failed with `code` (its metric's outcome is `outcome`)."""

    def __init__(self, code: grpc.StatusCode, outcome: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.outcome = outcome

    def details(self) -> str:
        """The status details a caller gets: the message, cut to 1 KiB."""
        return str(self)[:1024]


@dataclass(frozen=True)
class SectionRequest:
    """One guard's question about one text (docs: /work/notes/judge-interface.md)."""

    guard_id: str
    """The calling processor's id: the section's name in a merged call."""
    processor: str
    """Its metric label (a name the config knows, else ``other``)."""
    model: str
    """The judge model as the guard named it."""
    run_id: str
    resource: str | None
    """The resource the caller's key is bound to: calls of two tenants never merge."""
    phase: str
    content: str
    instructions: str
    question: str
    schema: Mapping[str, Any]
    messages: tuple[dict[str, Any], ...]
    """The prompt the call is made with when nothing merges (the guard's own, alone)."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    agent: str | None = None
    """The agent of the run, when the run is live on this replica (its lanes plan the merge)."""

    def lane_key(self) -> str:
        """Questions with equal keys come from one lane of one run (any content)."""
        return self._lane_key

    def merge_key(self) -> str:
        """Questions with equal keys may share one model call: one lane's, about one content."""
        return self._merge_key

    def cache_key(self) -> str:
        """Everything the section's answer depends on (a verdict cache's address)."""
        return self._cache_key

    # each digest made once (the planner asks for them as the request comes and as it is answered)
    @functools.cached_property
    def _lane_key(self) -> str:
        return lane_key(self.model, self.run_id, self.resource, self.phase, self.settings)

    @functools.cached_property
    def _merge_key(self) -> str:
        return merge_key(self._lane_key, self.content)

    @functools.cached_property
    def _cache_key(self) -> str:
        return _digest(
            [
                self.model,
                self.guard_id,
                self.resource,
                self.phase,
                self.content,
                self.instructions,
                self.question,
                dict(self.schema),
                dict(self.settings),
            ]
        )


@dataclass(frozen=True)
class SectionVerdict:
    """A guard's answer: its section's value (valid against its schema) and the call's facts."""

    value: Any
    text: str
    usage: dict[str, int]
    """This guard's share of the call's tokens (a merged call's split evenly)."""
    model: str
    finish_reason: str
    attempts: int
    sections: int
    """Sections of the call that answered it: 1 alone, more merged, 0 no call (e.g. a cache)."""


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(_canonical(parts).encode()).hexdigest()


_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode
"""`json.dumps` with these options, its encoder made once (``dumps`` makes one per call)."""


def section_names(requests: Sequence[SectionRequest]) -> list[str]:
    """Each request's property name: its guard id (JSON-schema-safe), numbered when two share one."""
    names: list[str] = []
    for request in requests:
        base = _NAME.sub("_", request.guard_id) or "guard"
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}_{n}"
        names.append(name)
    return names


def merged_schema(names: Sequence[str], requests: Sequence[SectionRequest]) -> dict[str, Any]:
    """One object with a required property per section, each the guard's own schema."""
    return {
        "type": "object",
        "properties": {name: dict(r.schema) for name, r in zip(names, requests, strict=True)},
        "required": list(names),
        "additionalProperties": False,
    }


def content_line(content: str, phase: str) -> str:
    """The content, quoted, as the built-in guards quote it (a window says what it is)."""
    where = (
        "This is one part of an answer being streamed; judge it as it stands.\n" if phase == "output" else ""
    )
    return f'{where}Content: "{content}"'


def merged_prompt(names: Sequence[str], requests: Sequence[SectionRequest]) -> list[dict[str, Any]]:
    """A system message with every guard's instructions and question, then the content once."""
    parts = [
        "You are several independent checks of the same content. Each check below has its own "
        "instructions; answer each exactly as if it were the only one, under the JSON property "
        "named after it. One check's answer never influences another's."
    ]
    for name, request in zip(names, requests, strict=True):
        parts.append(f'## Check "{name}"\n{request.instructions}\n\n{request.question}')
    content = content_line(requests[0].content, requests[0].phase)
    return [
        {"role": "system", "content": "\n\n".join(parts)},
        {"role": "user", "content": [{"type": "text", "text": content}]},
    ]


def parse_json(text: str) -> tuple[Any, str | None]:
    """The answer's JSON value (a code fence around it allowed) and None, or None and what is wrong."""
    fenced = _FENCE.match(text)
    try:
        return json.loads(fenced["body"] if fenced else text), None
    except ValueError as exc:
        return None, f"the answer is not JSON ({exc})"


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """What makes `schema` not a JSON schema, or None."""
    return _schema_problem(json.dumps(schema, sort_keys=True, ensure_ascii=False))


@functools.lru_cache(maxsize=256)
def _schema_problem(text: str) -> str | None:
    # Checked once per schema: the check against the meta-schema takes milliseconds, and a guard
    # sends its schema with every question (a turn's history, every window of the answer).
    schema = json.loads(text)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return str(exc.message)
    return None


def problem(value: Any, schema: Mapping[str, Any]) -> str | None:
    """What makes `value` not match `schema`, or None."""
    try:
        jsonschema.validators.validator_for(schema)(schema).validate(value)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"the answer does not match the schema at {where}: {exc.message}"
    return None


def split(
    text: str, names: Sequence[str], requests: Sequence[SectionRequest]
) -> list[tuple[Any, str | None]]:
    """Each section's value and None, or None and what is wrong with that section alone."""
    answer, wrong = parse_json(text)
    if wrong is None and not isinstance(answer, dict):
        wrong = "the answer is not a JSON object with a property per check"
    if wrong is not None:
        return [(None, wrong)] * len(names)
    out: list[tuple[Any, str | None]] = []
    for name, request in zip(names, requests, strict=True):
        if name not in answer:
            out.append((None, f"the answer has no property {name!r}"))
            continue
        bad = problem(answer[name], request.schema)
        out.append((None, f"{name}: {bad}") if bad else (answer[name], None))
    return out


def shares(usage: Mapping[str, int], count: int) -> list[dict[str, int]]:
    """`usage` split over `count` sections (the remainder to the first), so the shares sum to it."""
    out = [{k: v // count for k, v in usage.items()} for _ in range(count)]
    for k, v in usage.items():
        out[0][k] += v % count
    return out


def lane_key(model: str, run_id: str, resource: str | None, phase: str, settings: Mapping[str, Any]) -> str:
    """`SectionRequest.lane_key` of a request with these fields."""
    return _digest([model, run_id, resource, phase, dict(settings)])


def merge_key(lane: str, content: str) -> str:
    """`SectionRequest.merge_key` of a request of `lane` about `content`."""
    return _digest([lane, content])


def section_request(
    request: mpb.ModelServiceGenerateRequest,
    processor: str,
    resource: str | None,
    prompt: list[dict[str, Any]],
    schema: dict[str, Any],
    settings: Mapping[str, Any],
    agent: str | None,
) -> SectionRequest:
    """A gateway request carrying a `section` as the planner takes it (`prompt`: its own, alone)."""
    section = request.section
    return SectionRequest(
        guard_id=request.processor_id,
        processor=processor,
        model=request.model,
        run_id=request.run_id,
        resource=resource,
        phase=section.phase,
        content=section.content,
        instructions=section.instructions,
        question=section.question,
        schema=schema,
        messages=tuple(prompt),
        settings=dict(settings),
        agent=agent,
    )


def as_response(verdict: SectionVerdict) -> mpb.ModelServiceGenerateResponse:
    """A guard's section as the gateway answers its call."""
    out = mpb.ModelServiceGenerateResponse(
        text=verdict.text,
        finish_reason=verdict.finish_reason,
        model=verdict.model,
        attempts=verdict.attempts,
    )
    out.object.CopyFrom(convert.to_value(verdict.value))
    convert.usage_to_proto(verdict.usage, out.usage)
    return out
