"""The model gateway's typed verdicts: the verdict cache, the judge planner and each run's
questions in flight, in the order a request meets them.

A request with a schema is a judge's question. With ``judgeCache`` the cache answers one asked
before (`verdict_cache`); else a request with a ``section`` goes to the judge planner
(`judge_planner`: merged with the other guards' questions about the same text), one without to
its own model call; either is cancelled at its run's end (`run_judging`). A request without a
schema is free text, left to its caller: one model call, never cached, merged or cancelled here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from procmesh import convert, tracing
from procmesh.v1 import model_pb2 as mpb
from procmesh_orchestrator.service.grpc.gateway_calls import GatewayCalls, ModelCall, instruction
from procmesh_orchestrator.service.grpc.gateway_policy import Children, GatewayModels
from procmesh_orchestrator.service.grpc.judge_planner import Judge, JudgePlanner
from procmesh_orchestrator.service.grpc.judge_sections import (
    SectionRequest,
    SectionVerdict,
    as_response,
    section_request,
)
from procmesh_orchestrator.service.grpc.run_judging import RunJudging
from procmesh_orchestrator.service.grpc.verdict_cache import VerdictCache

if TYPE_CHECKING:
    from procmesh_orchestrator.service.api.core import ServiceCore


@dataclass(frozen=True)
class Question:
    """One gateway request as its answer is sought: the request, the resource its caller's key is
    bound to (a verdict's tenant), and the model call that answers it when nothing else does."""

    request: mpb.ModelServiceGenerateRequest
    resource: str | None
    call: ModelCall


class GatewayJudging:
    """The answers to `service`'s gateway requests, through `calls` (`models`: the serving config's)."""

    def __init__(
        self,
        service: ServiceCore,
        calls: GatewayCalls,
        models: Callable[[], GatewayModels],
        children: Children,
    ) -> None:
        self._service = service
        self._children = children
        self._calls = calls
        self._models = models
        self._cache: VerdictCache | None = None
        labels, metrics = (lambda model: models().model_label(model)), service.app.metrics
        self._planner = JudgePlanner(
            lambda: service.app.config, self._judge_once, self._judge_alone, metrics, labels
        )
        self.judge: Judge = self._planner.judge  # a section's verdict: what a cache or cheap-first wraps
        # at each run's end, and as a model call fails (its attempt's questions)
        app = service.app
        self._judging = RunJudging(
            metrics.judge_calls_saved, app.run_ended, app.attempt_failed, app.failed_attempt
        )

    @property
    def _verdicts(self) -> VerdictCache | None:
        """The judge verdict cache the serving config asks for (rebuilt when its section changes)."""
        config = self._service.app.config.judge_cache
        if not config.enabled:
            return None
        if self._cache is None or (self._cache.config is not config and self._cache.config != config):
            lookups, children = self._service.app.metrics.judge_cache_lookups, self._children
            self._cache = VerdictCache(config, lambda p, r: children(lookups, p, r).inc())
        return self._cache

    async def _judge_once(
        self, request: SectionRequest, prompt: list[dict[str, Any]], schema: dict[str, Any]
    ) -> tuple[str, str, dict[str, int], str]:
        """A merged judge call, metered as `request`'s (every section shares its run and caller)."""
        model = self._service.app.models.resolve(request.model, "model")
        costs = functools.partial(self._calls.costs, request.run_id, request.model, request.resource)
        prompt = [{"role": "system", "content": instruction(schema)}, *prompt]
        text, finish, usage = await self._calls.once(
            ModelCall(model, prompt, schema, dict(request.settings), costs)
        )
        return text, finish, usage, model.model_id

    async def _judge_alone(self, request: SectionRequest) -> SectionVerdict:
        """A section with nothing to merge: the guard's own call, as if it had sent no section."""
        model = self._service.app.models.resolve(request.model, "model")
        costs = functools.partial(self._calls.costs, request.run_id, request.model, request.resource)
        call = ModelCall(model, list(request.messages), dict(request.schema), dict(request.settings), costs)
        out = await self._calls.attempts(call)
        value, usage = convert.from_value(out.object), convert.usage_from_proto(out.usage)
        return SectionVerdict(value, out.text, usage, out.model, out.finish_reason, out.attempts, 1)

    def at_once(
        self,
        request: mpb.ModelServiceGenerateRequest,
        resource: str | None,
        schema: dict[str, Any],
        settings: dict[str, Any],
        processor: str,
    ) -> mpb.ModelServiceGenerateResponse | None:
        """`answer`'s answer when the verdict cache holds it in this process, counted as `answer`
        counts it, without awaiting; else None, nothing counted (`answer` then serves it)."""
        cache = self._verdicts
        if cache is None or self._judging.refuses(request.run_id):
            return None
        address = cache.address(request, schema, settings, resource)
        if address is None:
            return None
        response = cache.stored(address, processor)
        if response is None:
            return None
        self._children(self._service.app.metrics.judge_calls_saved, processor, "cache").inc()
        self._planner.cached(request, resource, settings)  # held its lane, and one fewer to wait for
        return response

    async def answer(self, question: Question) -> tuple[mpb.ModelServiceGenerateResponse, bool]:
        """The model's answer, or the verdict cache's for a question asked before (then True)."""
        request, resource, call = question.request, question.resource, question.call
        processor = self._models().processor_label(request.processor_id)
        if call.schema is not None:  # a question sent after its attempt failed: refused, not asked
            self._judging.refuse(request.run_id, processor)
        cache = self._verdicts
        if cache is None:
            return await self._ask(question), False
        self._planner.sending(
            request, resource, call.settings
        )  # a section the cache answers still holds its lane
        ask = lambda: self._ask(question)  # noqa: E731
        response, reused = await cache.answer(request, call.schema, call.settings, resource, processor, ask)
        if reused:
            self._children(self._service.app.metrics.judge_calls_saved, processor, "cache").inc()
            self._planner.answered(
                request, resource, call.settings
            )  # its text's group: one fewer to wait for
        return response, reused

    async def _ask(self, question: Question) -> mpb.ModelServiceGenerateResponse:
        """The model's answer; a guard's section goes through the judge planner (merged if it can)."""
        request, call = question.request, question.call
        if call.schema is None:  # free text: no judge's verdict, left to its caller
            return await self._calls.attempts(call)
        processor = self._models().processor_label(request.processor_id)
        if not request.HasField("section"):  # a verdict asked alone: cancelled at its run's end too
            return await self._judging.judging(request.run_id, processor, self._calls.attempts(call))
        agent = self._service.app.agent_of(request.run_id)
        asked = section_request(
            request, processor, question.resource, call.prompt, call.schema, call.settings, agent
        )
        started = time.perf_counter()
        with tracing.span(f"procmesh.judge.section {processor}") as span:
            verdict = await self._judging.judging(request.run_id, processor, self.judge(asked))
            span.set("procmesh.judge.sections", verdict.sections)
        source = "merged" if verdict.sections > 1 else "alone"
        seconds = time.perf_counter() - started
        self._service.app.metrics.judge_verdict_seconds.labels(processor, source).observe(seconds)
        return as_response(verdict)
