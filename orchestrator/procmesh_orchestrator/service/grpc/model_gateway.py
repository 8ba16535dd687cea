"""The model gateway: procmesh.v1.ModelService, the App's models served to its processors.

A guard that judges with a model (moderation, prompt injection, ...) calls the orchestrator,
never a provider: provider keys stay in this process. The gateway is for sidecars only and serves
only the models the config names (`gateway_policy`: a caller on the unix socket, or a key with the
``gateway`` or ``operator`` role; PERMISSION_DENIED otherwise, and NOT_FOUND for a model the config
does not name). A call is bounded by its gRPC deadline (the calling hook's remaining time), traced
as a child of the hook's span and counted in ``procmesh_gateway_calls_total{model,processor,
outcome}`` (labels only from the config's names) and in the model metrics every model call feeds.

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

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from procmesh import convert, tracing
from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from procmesh_orchestrator.errors import APICallError, ConfigError, LeaseLostError
from procmesh_orchestrator.run.framework.cost import CostLimitError, Reservation, RunCost
from procmesh_orchestrator.run.models import ModelProvider, ModelRequest
from procmesh_orchestrator.service._auth import grpc_caller
from procmesh_orchestrator.service._errors import ServiceError
from procmesh_orchestrator.service.grpc.gateway_policy import (
    GATEWAY_ROLES,
    UNKNOWN,
    GatewayModels,
    on_local_socket,
    shown,
)
from procmesh_orchestrator.service.grpc.judge_planner import Judge, JudgePlanner
from procmesh_orchestrator.service.grpc.judge_sections import Refused as _Refused
from procmesh_orchestrator.service.grpc.judge_sections import (
    SectionRequest,
    SectionVerdict,
    as_response,
    parse_json,
    problem,
    schema_problem,
    section_request,
)
from procmesh_orchestrator.service.grpc.run_judging import RunJudging
from procmesh_orchestrator.service.grpc.verdict_cache import VerdictCache

if TYPE_CHECKING:
    from procmesh_orchestrator.service.api.core import ServiceCore

log = logging.getLogger(__name__)

MODEL_SERVICE = mpb.DESCRIPTOR.services_by_name["ModelService"].full_name
"""``procmesh.v1.ModelService``."""

Context = grpc.aio.ServicerContext[Any, Any]

_ROLES = ("system", "user", "assistant")
_MAX_ATTRIBUTE = 64  # a span attribute from the caller: never an unbounded string


def add_model_gateway(service: ServiceCore, server: grpc.aio.Server) -> None:
    """Serve ModelService on `server` (the orchestrator's gRPC server) for `service`'s App."""
    mgrpc.add_ModelServiceServicer_to_server(_ModelServicer(service), server)


def _caller_resource(service: ServiceCore, context: Context) -> str | None:
    """Let the caller in (`_Refused` otherwise); the resource its key is bound to, if any.

    On the unix socket any caller is served (a key it sends is still checked); on the TCP port a
    key with the ``gateway`` or ``operator`` role; with no keys configured, every caller."""
    keys = service.keys
    if not keys.enabled:
        return None
    local = on_local_socket(context.peer() or "")
    if local and not any(k == "authorization" for k, _ in context.invocation_metadata() or ()):
        return None
    try:
        caller = grpc_caller(keys, context)
    except ServiceError as exc:
        raise _Refused(exc.grpc_code, "unauthenticated", str(exc)) from None
    if not local and not caller.roles & GATEWAY_ROLES:
        raise _Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            "permission_denied",
            "the model gateway serves sidecars only: on the gRPC port it needs a key with the 'gateway' "
            "role (an entry KEY=@gateway in PROCMESH_API_KEYS) or the 'operator' role; a sidecar in the "
            "pod may call it over the orchestrator's unix socket (--grpc-socket) instead",
        )
    return caller.resource


def access_check(service: ServiceCore) -> Callable[[Context], Awaitable[None]]:
    """The check the gRPC server runs before it decodes a ModelService request, so a caller the
    gateway refuses learns nothing about decoding; counted with the labels ``unknown`` (the
    request is not read) and logged in one line."""

    async def check(context: Context) -> None:
        try:
            _caller_resource(service, context)
        except _Refused as exc:
            service.app.metrics.gateway_calls.labels(UNKNOWN, UNKNOWN, exc.outcome).inc()
            log.info("model gateway refused a caller at %s: %s", shown(context.peer() or ""), exc.outcome)
            await context.abort(exc.code, str(exc))

    return check


def instruction(schema: dict[str, Any]) -> str:
    """The system message asking for JSON matching `schema` (inlined: every model reads it)."""
    return (
        "Answer with one JSON value that matches this JSON schema, and nothing else "
        f"(no prose, no code fence):\n{json.dumps(schema, ensure_ascii=False)}"
    )


def parse_answer(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """The answer's JSON value and None, or None and what is wrong with it."""
    value, wrong = parse_json(text)
    if wrong is None:
        wrong = problem(value, schema)
    return (None, wrong) if wrong else (value, None)


def _prompt(request: mpb.ModelServiceGenerateRequest) -> list[dict[str, Any]]:
    """The request's messages in the providers' prompt shape."""
    if not request.messages:
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", "messages: give at least one")
    prompt: list[dict[str, Any]] = []
    for i, message in enumerate(request.messages):
        if message.role not in _ROLES:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                "invalid_argument",
                f"messages[{i}].role: {message.role[:32]!r} is not one of {', '.join(_ROLES)}",
            )
        if message.role == "system":
            prompt.append({"role": "system", "content": message.text})
        else:
            prompt.append({"role": message.role, "content": [{"type": "text", "text": message.text}]})
    return prompt


def _schema(request: mpb.ModelServiceGenerateRequest) -> dict[str, Any] | None:
    if not request.HasField("schema"):
        return None
    schema = convert.from_struct(request.schema)
    wrong = schema_problem(schema)
    if wrong is not None:
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", f"schema: not a JSON schema: {wrong}"
        )
    return schema


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


class _ModelServicer(mgrpc.ModelServiceServicer):
    def __init__(self, service: ServiceCore) -> None:
        self._service = service
        self._models_of = service.app.config
        self._gateway_models = GatewayModels.of(service.app.config)
        self._cache: VerdictCache | None = None
        labels, metrics = (lambda model: self._models.model_label(model)), service.app.metrics
        self._planner = JudgePlanner(
            lambda: service.app.config, self._judge_once, self._judge_alone, metrics, labels
        )
        self.judge: Judge = self._planner.judge  # a section's verdict: what a cache or cheap-first wraps
        self._judging = RunJudging(metrics.judge_calls_saved, service.app.run_ended)  # at each run's end

    @property
    def _verdicts(self) -> VerdictCache | None:
        """The judge verdict cache the serving config asks for (rebuilt when its section changes)."""
        config = self._service.app.config.judge_cache
        if not config.enabled:
            return None
        if self._cache is None or self._cache.config != config:
            metrics = self._service.app.metrics
            self._cache = VerdictCache(config, lambda p, r: metrics.judge_cache_lookups.labels(p, r).inc())
        return self._cache

    @property
    def _models(self) -> GatewayModels:
        """The serving config's models and who may call them (rebuilt after a reload)."""
        config = self._service.app.config
        if config is not self._models_of:
            self._models_of, self._gateway_models = config, GatewayModels.of(config)
        return self._gateway_models

    async def _judge_once(
        self, request: SectionRequest, prompt: list[dict[str, Any]], schema: dict[str, Any]
    ) -> tuple[str, str, dict[str, int], str]:
        """A merged judge call, metered as `request`'s (every section shares its run and caller)."""
        model = self._service.app.models.resolve(request.model, "model")
        costs = self._costs(request.run_id, request.model, request.resource)
        prompt = [{"role": "system", "content": instruction(schema)}, *prompt]
        text, finish, usage = await self._once(model, prompt, schema, dict(request.settings), costs)
        return text, finish, usage, model.model_id

    async def _judge_alone(self, request: SectionRequest) -> SectionVerdict:
        """A section with nothing to merge: the guard's own call, as if it had sent no section."""
        model = self._service.app.models.resolve(request.model, "model")
        costs = self._costs(request.run_id, request.model, request.resource)
        prompt, schema, settings = list(request.messages), dict(request.schema), dict(request.settings)
        out = await self._attempts(model, prompt, schema, settings, costs)
        value, usage = convert.from_value(out.object), convert.usage_from_proto(out.usage)
        return SectionVerdict(value, out.text, usage, out.model, out.finish_reason, out.attempts, 1)

    async def Generate(
        self, request: mpb.ModelServiceGenerateRequest, context: Context
    ) -> mpb.ModelServiceGenerateResponse:
        metrics = self._service.app.metrics
        processor = self._models.processor_label(request.processor_id)
        model_label = self._models.model_label(request.model)
        started = time.perf_counter()
        remaining = context.time_remaining()
        deadline = None if remaining is None else time.monotonic() + remaining
        metadata = list(context.invocation_metadata() or ())
        attributes = {
            "gen_ai.request.model": request.model[:_MAX_ATTRIBUTE],
            "procmesh.processor.id": processor,
            "procmesh.run.id": request.run_id[:_MAX_ATTRIBUTE] or None,
        }
        parent = metadata if tracing.enabled() else None
        outcome = "ok"
        try:
            with tracing.span(
                f"procmesh.model_gateway {model_label}", kind="server", attributes=attributes, parent=parent
            ) as span:
                try:
                    response = await self._generate(request, context)
                except _Refused as exc:
                    outcome = exc.outcome
                    span.outcome(outcome)
                    await self._abort(context, exc)
                span.outcome("ok")
                return response
        except asyncio.CancelledError:
            # gRPC cancels the handler when the deadline passes (a 50 ms slack for the clocks)
            late = deadline is not None and time.monotonic() >= deadline - 0.05
            outcome = "deadline" if late else "cancelled"
            raise
        finally:
            metrics.gateway_calls.labels(model_label, processor, outcome).inc()
            log.info(  # the caller's text escaped: a newline in it cannot forge a line
                "model gateway model=%s processor=%s run=%s outcome=%s %.3fs (deadline %s)",
                shown(request.model),
                shown(request.processor_id),
                shown(request.run_id),
                outcome,
                time.perf_counter() - started,
                "none" if remaining is None else f"{remaining:.3f}s",
            )

    async def ReportSaved(
        self, request: mpb.ModelServiceReportSavedRequest, context: Context
    ) -> mpb.ModelServiceReportSavedResponse:
        """Judge calls a processor's own pre-check saved (no model called): counted as
        ``by="precheck"``, so one series shows every judge call not made, wherever it was saved."""
        try:
            _caller_resource(self._service, context)
            if request.count < 1:
                raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", "count: at least 1")
        except _Refused as exc:
            await self._abort(context, exc)
        processor = self._models.processor_label(request.processor_id)
        self._service.app.metrics.judge_calls_saved.labels(processor, "precheck").inc(request.count)
        return mpb.ModelServiceReportSavedResponse()

    async def _abort(self, context: Context, exc: _Refused) -> NoReturn:
        await context.abort(exc.code, str(exc)[:1024])
        raise AssertionError("context.abort() returns only by raising")  # pragma: no cover

    async def _generate(
        self, request: mpb.ModelServiceGenerateRequest, context: Context
    ) -> mpb.ModelServiceGenerateResponse:
        service = self._service
        resource = _caller_resource(service, context)
        if not request.model:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", "model: give a reference")
        if not self._models.knows(request.model):
            raise _Refused(
                grpc.StatusCode.NOT_FOUND,
                "not_in_config",
                f"model {shown(request.model)} is not in the orchestrator's config: the gateway serves "
                "only the models the config names (an agent's models, a processor option naming a "
                "model, a `models` or `prices` key)",
            )
        try:
            model = service.app.models.resolve(request.model, "model")
        except ConfigError as exc:
            raise _Refused(grpc.StatusCode.NOT_FOUND, "not_found", str(exc)) from None
        prompt = _prompt(request)
        schema = _schema(request)
        settings: dict[str, Any] = {}
        if request.HasField("temperature"):
            settings["temperature"] = request.temperature
        if request.HasField("max_output_tokens"):
            settings["maxOutputTokens"] = request.max_output_tokens
        if schema is not None:
            prompt = [{"role": "system", "content": instruction(schema)}, *prompt]
        remaining = context.time_remaining()
        costs = self._costs(request.run_id, request.model, resource)
        try:
            async with asyncio.timeout(remaining):
                return await self._answer(request, resource, schema, settings, model, prompt, costs)
        except TimeoutError:
            raise _Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "deadline",
                f"model {shown(request.model)} did not answer within the call's deadline ({remaining:.3f}s)",
            ) from None
        except LeaseLostError:
            # the calling durable run's ledger write was fenced: another replica holds the run now
            raise _Refused(
                grpc.StatusCode.ABORTED,
                "lease_lost",
                "the calling run is no longer held by this replica (another one took it over): "
                "its cost cannot be counted here, so the call is refused",
            ) from None

    async def _answer(
        self,
        request: mpb.ModelServiceGenerateRequest,
        resource: str | None,
        schema: dict[str, Any] | None,
        settings: dict[str, Any],
        model: ModelProvider,
        prompt: list[dict[str, Any]],
        costs: list[RunCost],
    ) -> mpb.ModelServiceGenerateResponse:
        """The model's answer, or the verdict cache's for a question asked before."""
        cache = self._verdicts
        if cache is None:
            return await self._ask(request, resource, schema, settings, model, prompt, costs)
        processor = self._models.processor_label(request.processor_id)
        self._planner.sending(request, resource, settings)  # a section the cache answers still holds its lane
        ask = lambda: self._ask(request, resource, schema, settings, model, prompt, costs)  # noqa: E731
        response, reused = await cache.answer(request, schema, settings, resource, processor, ask)
        if reused:
            self._service.app.metrics.judge_calls_saved.labels(processor, "cache").inc()
        return response

    async def _ask(
        self,
        request: mpb.ModelServiceGenerateRequest,
        resource: str | None,
        schema: dict[str, Any] | None,
        settings: dict[str, Any],
        model: ModelProvider,
        prompt: list[dict[str, Any]],
        costs: list[RunCost],
    ) -> mpb.ModelServiceGenerateResponse:
        """The model's answer; a guard's section goes through the judge planner (merged if it can)."""
        if schema is None:  # free text: no judge's verdict, left to its caller
            return await self._attempts(model, prompt, schema, settings, costs)
        processor = self._models.processor_label(request.processor_id)
        if not request.HasField("section"):  # a verdict asked alone: cancelled at its run's end too
            alone = self._attempts(model, prompt, schema, settings, costs)
            return await self._judging.judging(request.run_id, processor, alone)
        agent = self._service.runs.agent_of(request.run_id)
        asked = section_request(request, processor, resource, prompt, schema, settings, agent)
        started = time.perf_counter()
        with tracing.span(f"procmesh.judge.section {processor}") as span:
            verdict = await self._judging.judging(request.run_id, processor, self.judge(asked))
            span.set("procmesh.judge.sections", verdict.sections)
        source = "merged" if verdict.sections > 1 else "alone"
        seconds = time.perf_counter() - started
        self._service.app.metrics.judge_verdict_seconds.labels(processor, source).observe(seconds)
        return as_response(verdict)

    def _costs(self, run_id: str, model: str, resource: str | None) -> list[RunCost]:
        """The limits the call counts against: its run's, while the run lives here; else those of
        the agents naming `model`, one per scope key (the strictest where agents share one)."""
        agents = self._service.app.agents
        for agent in agents.values():
            control = agent.spec.cost
            found = control.of_run(run_id) if control is not None and run_id else None
            if found is not None:
                return [found]
        by_key: dict[str, RunCost] = {}
        for agent_id in self._models.agents_of.get(model, ()):
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
            raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, "cost_limit", str(exc)) from None
        return held

    async def _once(
        self,
        model: ModelProvider,
        prompt: list[dict[str, Any]],
        schema: dict[str, Any] | None,
        settings: dict[str, Any],
        costs: list[RunCost],
    ) -> tuple[str, str, dict[str, int]]:
        """One model call, metered against `costs` and counted: text, finish reason, usage."""
        metrics = self._service.app.metrics
        request = ModelRequest(
            prompt=prompt,
            streaming=False,
            model_settings=dict(settings),
            response_format=None if schema is None else {"type": "json", "schema": schema},
        )
        started = time.perf_counter()
        held = await self._reserve(costs, model.model_id, prompt, settings.get("maxOutputTokens"))
        try:
            text, finish, usage = await _collect(model, request)
        except APICallError as exc:
            # a refused call cost nothing; a cancelled one may have: its estimate stays
            for cost, reservation in held:
                await cost.release(reservation)
            metrics.model_calls.labels(model.model_id, "error").inc()
            code = grpc.StatusCode.UNAVAILABLE if exc.retryable else grpc.StatusCode.FAILED_PRECONDITION
            raise _Refused(code, "api_error", f"model {model.model_id!r} failed: {exc}") from None
        for cost, reservation in held:
            await cost.settle(reservation, usage)
        metrics.model_calls.labels(model.model_id, "ok").inc()
        metrics.model_call_duration.labels(model.model_id).observe(time.perf_counter() - started)
        for key, direction in (("inputTokens", "input"), ("outputTokens", "output")):
            metrics.model_tokens.labels(model.model_id, direction).inc(usage.get(key, 0))
        return text, finish, usage

    async def _attempts(
        self,
        model: ModelProvider,
        prompt: list[dict[str, Any]],
        schema: dict[str, Any] | None,
        settings: dict[str, Any],
        costs: list[RunCost],
    ) -> mpb.ModelServiceGenerateResponse:
        """Call the model (twice when the first answer does not match the schema)."""
        totals = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}
        problem = ""
        for attempt in (1, 2):
            text, finish, usage = await self._once(model, prompt, schema, settings, costs)
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
            prompt = [
                *prompt,
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
        raise _Refused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "invalid_output",
            f"model {model.model_id!r} did not answer with JSON matching the schema in 2 attempts: {problem}",
        )
