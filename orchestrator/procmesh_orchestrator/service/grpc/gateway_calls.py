"""The model gateway's model calls: the request read into a prompt, each call metered and counted,
a structured answer checked against its schema.

Cost control meters every call (reserved before, settled after; refused with RESOURCE_EXHAUSTED,
outcome ``cost_limit``, once the scope spent its limit): a call whose ``run_id`` names a run live on
this replica whose agent has a ``costControl`` counts against that run's limit and scope key; any
other call (no run, or a run not live here) counts against the limit of every agent whose config
names the model, under the scope key a call outside a run has (``global``, ``agent:<id>``, or
``resource:<id>`` of the resource the caller's key is bound to; none for a thread), the strictest
limit where two agents share a key.

Structured output: with a schema, the model is asked for JSON (the request's response format,
which providers with a JSON-schema mode use, and an instruction every model reads), the answer is
parsed and validated with jsonschema, and an answer that does not match gets one retry (the model
is told what was wrong); a second miss is FAILED_PRECONDITION naming the problem.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import struct_pb2

from procmesh import convert
from procmesh.v1 import model_pb2 as mpb
from procmesh_orchestrator.errors import APICallError
from procmesh_orchestrator.run.framework.cost import CostLimitError, Reservation, RunCost
from procmesh_orchestrator.run.models import ModelProvider, ModelRequest
from procmesh_orchestrator.service.grpc.gateway_policy import GatewayModels
from procmesh_orchestrator.service.grpc.judge_sections import Refused, parse_json, problem, schema_problem

if TYPE_CHECKING:
    from procmesh_orchestrator.service.api.core import ServiceCore

log = logging.getLogger(__name__)

_ROLES = ("system", "user", "assistant")


def instruction(schema: dict[str, Any]) -> str:
    """The system message asking for JSON matching `schema` (inlined: every model reads it)."""
    return (
        "Answer with one JSON value that matches this JSON schema, and nothing else "
        f"(no prose, no code fence):\n{json.dumps(schema, ensure_ascii=False)}"
    )


@dataclass(frozen=True)
class AnswerSchema:
    """A request's answer schema, checked, and the instruction that asks for it."""

    value: dict[str, Any]
    """The JSON schema (shared by every request sending it: never changed)."""
    instruction: str


def parse_answer(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """The answer's JSON value and None, or None and what is wrong with it."""
    value, wrong = parse_json(text)
    if wrong is None:
        wrong = problem(value, schema)
    return (None, wrong) if wrong else (value, None)


def messages_valid(request: mpb.ModelServiceGenerateRequest) -> bool:
    """Whether `prompt_of` takes the request's messages (else it refuses them)."""
    return bool(request.messages) and all(message.role in _ROLES for message in request.messages)


def prompt_of(request: mpb.ModelServiceGenerateRequest) -> list[dict[str, Any]]:
    """The request's messages in the providers' prompt shape."""
    if not request.messages:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", "messages: give at least one")
    prompt: list[dict[str, Any]] = []
    for i, message in enumerate(request.messages):
        if message.role not in _ROLES:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "invalid_argument",
                f"messages[{i}].role: {message.role[:32]!r} is not one of {', '.join(_ROLES)}",
            )
        if message.role == "system":
            prompt.append({"role": "system", "content": message.text})
        else:
            prompt.append({"role": message.role, "content": [{"type": "text", "text": message.text}]})
    return prompt


def schema_of(request: mpb.ModelServiceGenerateRequest) -> AnswerSchema | None:
    """The request's answer schema, if it has one (INVALID_ARGUMENT when it is no JSON schema).

    A guard asks every question with one of a few schemas: each is converted, checked and made
    into its instruction once (keyed by its bytes), the same `AnswerSchema` returned after.
    """
    if not request.HasField("schema"):
        return None
    return _checked_schema(request.schema.SerializeToString(deterministic=True))


@functools.lru_cache(maxsize=256)  # a deployment's guards ask with a few schemas
def _checked_schema(raw: bytes) -> AnswerSchema:
    schema = convert.from_struct(struct_pb2.Struct.FromString(raw))
    wrong = schema_problem(schema)
    if wrong is not None:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", f"schema: not a JSON schema: {wrong}"
        )
    return AnswerSchema(schema, instruction(schema))


async def _collect(model: ModelProvider, request: ModelRequest) -> tuple[str, str, dict[str, int]]:
    """One model call, its stream collected: text, finish reason, usage."""
    text: list[str] = []
    finish, usage = "stop", dict[str, int]()
    async for chunk in model.stream(request):
        payload = chunk.get("payload") or {}
        if chunk.get("type") == "text-delta":
            text.append(str(payload.get("text", "")))
        elif chunk.get("type") == "finish":
            finish = str(payload.get("finishReason") or "stop")
            usage = {k: int(v or 0) for k, v in (payload.get("usage") or {}).items() if isinstance(v, int)}
    return "".join(text), finish, usage


@dataclass(frozen=True)
class ModelCall:
    """One model call as the gateway makes it: the model, what it is asked, and what it is metered against."""

    model: ModelProvider
    prompt: list[dict[str, Any]]
    schema: dict[str, Any] | None
    """The answer's JSON schema (None: free text)."""
    settings: dict[str, Any]
    """``temperature``, ``maxOutputTokens`` when the caller gave them."""
    costs: Callable[[], list[RunCost]]
    """The limits it counts against (`GatewayCalls.costs`), found as the call is made: a question
    the verdict cache or a merged call answers needs none."""


class GatewayCalls:
    """The gateway's model calls for `service`'s App (`models`: the serving config's models)."""

    def __init__(self, service: ServiceCore, models: Callable[[], GatewayModels]) -> None:
        self._service = service
        self._models = models

    def costs(self, run_id: str, model: str, resource: str | None) -> list[RunCost]:
        """The limits the call counts against: its run's, while the run lives here; else those of
        the agents naming `model`, one per scope key (the strictest where agents share one)."""
        agents = self._service.app.agents
        for agent in agents.values():
            control = agent.spec.cost
            found = control.of_run(run_id) if control is not None and run_id else None
            if found is not None:
                return [found]
        by_key: dict[str, RunCost] = {}
        for agent_id in self._models().agents_of.get(model, ()):
            control = agents[agent_id].spec.cost if agent_id in agents else None
            if control is None:
                continue
            cost = control.for_gateway(resource)
            key = cost.scope_key or f"unlimited:{agent_id}"  # reserve() counts it as unlimited
            held = by_key.get(key)
            if held is None or control.limit < held.control.limit:
                by_key[key] = cost
        return list(by_key.values())

    @staticmethod
    async def _reserve(
        costs: list[RunCost], model_id: str, prompt: Any, max_output: Any
    ) -> list[tuple[RunCost, Reservation]]:
        """Hold the call's estimate against each limit; the first refusal releases the others."""
        held: list[tuple[RunCost, Reservation]] = []
        try:
            for cost in costs:
                reservation = await cost.reserve(model_id, prompt, max_output)
                if reservation is not None:
                    held.append((cost, reservation))
        except CostLimitError as exc:
            for cost, reservation in held:
                await cost.release(reservation)
            raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "cost_limit", str(exc)) from None
        return held

    async def once(self, call: ModelCall) -> tuple[str, str, dict[str, int]]:
        """One model call, metered against its costs and counted: text, finish reason, usage."""
        metrics = self._service.app.metrics
        model, schema = call.model, call.schema
        request = ModelRequest(
            prompt=call.prompt,
            streaming=False,
            model_settings=dict(call.settings),
            response_format=None if schema is None else {"type": "json", "schema": schema},
        )
        started = time.perf_counter()
        held = await self._reserve(
            call.costs(), model.model_id, call.prompt, call.settings.get("maxOutputTokens")
        )
        try:
            text, finish, usage = await _collect(model, request)
        except APICallError as exc:
            # a refused call cost nothing; a cancelled one may have: its estimate stays
            for cost, reservation in held:
                await cost.release(reservation)
            metrics.model_calls.labels(model.model_id, "error").inc()
            code = grpc.StatusCode.UNAVAILABLE if exc.retryable else grpc.StatusCode.FAILED_PRECONDITION
            raise Refused(code, "api_error", f"model {model.model_id!r} failed: {exc}") from None
        for cost, reservation in held:
            await cost.settle(reservation, usage)
        metrics.model_calls.labels(model.model_id, "ok").inc()
        metrics.model_call_duration.labels(model.model_id).observe(time.perf_counter() - started)
        for key, direction in (("inputTokens", "input"), ("outputTokens", "output")):
            metrics.model_tokens.labels(model.model_id, direction).inc(usage.get(key, 0))
        return text, finish, usage

    async def attempts(self, call: ModelCall) -> mpb.ModelServiceGenerateResponse:
        """Make `call` (twice when the first answer does not match its schema)."""
        model, schema = call.model, call.schema
        totals = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}
        problem = ""
        for attempt in (1, 2):
            text, finish, usage = await self.once(call)
            for key in totals:
                totals[key] += usage.get(key, 0)
            out = mpb.ModelServiceGenerateResponse(
                text=text, finish_reason=finish, model=model.model_id, attempts=attempt
            )
            convert.usage_to_proto(totals, out.usage)
            if schema is None:
                return out
            value, problem_or_none = parse_answer(text, schema)
            if problem_or_none is None:
                out.object.CopyFrom(convert.to_value(value))
                return out
            problem = problem_or_none
            log.warning("model gateway: %s off-schema (try %d): %r", model.model_id, attempt, problem)
            retry = [
                *call.prompt,
                {"role": "assistant", "content": [{"type": "text", "text": text}]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "text",
                            "text": f"That answer is invalid: {problem}. Answer again with the JSON only.",
                        }
                    ],
                },
            ]
            call = dataclasses.replace(call, prompt=retry)
        raise Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "invalid_output",
            f"model {model.model_id!r} did not answer with JSON matching the schema in 2 attempts: {problem}",
        )
