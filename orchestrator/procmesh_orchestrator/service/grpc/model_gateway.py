"""The model gateway: procmesh.v1.ModelService, the App's models served to its processors.

A guard that judges with a model (moderation, prompt injection, ...) calls the orchestrator,
never a provider: provider keys stay in this process. The gateway is for sidecars only and serves
only the models the config names (`gateway_policy`: a caller on the unix socket, or a key with the
``gateway`` or ``operator`` role; PERMISSION_DENIED otherwise, and NOT_FOUND for a model the config
does not name). A call is bounded by its gRPC deadline (the calling hook's remaining time), traced
as a child of the hook's span and counted in ``procmesh_gateway_calls_total{model,processor,
outcome}`` (labels only from the config's names) and in the model metrics every model call feeds.

The rest is in the room's other modules: each model call, metered by cost control and checked
against its schema, in `gateway_calls`; a typed verdict's way through the verdict cache, the judge
planner and its run's questions in flight in `gateway_judging`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, NoReturn

import grpc

from procmesh import tracing
from procmesh.v1 import model_pb2 as mpb
from procmesh.v1 import model_pb2_grpc as mgrpc
from procmesh_orchestrator.errors import ConfigError, LeaseLostError
from procmesh_orchestrator.service.grpc.gateway_calls import (
    GatewayCalls,
    ModelCall,
    prompt_of,
    schema_of,
)
from procmesh_orchestrator.service.grpc.gateway_judging import GatewayJudging, Question
from procmesh_orchestrator.service.grpc.gateway_policy import Context, GatewayModels, caller_resource, shown
from procmesh_orchestrator.service.grpc.judge_sections import Refused

if TYPE_CHECKING:
    from procmesh_orchestrator.service.api.core import ServiceCore

log = logging.getLogger(__name__)

MODEL_SERVICE = mpb.DESCRIPTOR.services_by_name["ModelService"].full_name
"""``procmesh.v1.ModelService``."""

_MAX_ATTRIBUTE = 64  # a span attribute from the caller: never an unbounded string
MAX_BATCH = 1024
"""Calls one GenerateBatch may carry."""


def add_model_gateway(service: ServiceCore, server: grpc.aio.Server) -> None:
    """Serve ModelService on `server` (the orchestrator's gRPC server) for `service`'s App."""
    mgrpc.add_ModelServiceServicer_to_server(_ModelServicer(service), server)


class _ModelServicer(mgrpc.ModelServiceServicer):
    def __init__(self, service: ServiceCore) -> None:
        self._service = service
        self._models_of = service.app.config
        self._gateway_models = GatewayModels.of(service.app.config)
        models = lambda: self._models  # noqa: E731
        self._calls = GatewayCalls(service, models)
        self._judging = GatewayJudging(service, self._calls, models)

    @property
    def _models(self) -> GatewayModels:
        """The serving config's models and who may call them (rebuilt after a reload)."""
        config = self._service.app.config
        if config is not self._models_of:
            self._models_of, self._gateway_models = config, GatewayModels.of(config)
        return self._gateway_models

    async def Generate(
        self, request: mpb.ModelServiceGenerateRequest, context: Context
    ) -> mpb.ModelServiceGenerateResponse:
        try:
            return await self._serve(request, context, context.time_remaining())
        except Refused as exc:
            await self._abort(context, exc)

    async def GenerateBatch(
        self, request: mpb.ModelServiceGenerateBatchRequest, context: Context
    ) -> AsyncIterator[mpb.ModelServiceGenerateBatchResponse]:
        """Each item served as Generate serves it alone, its answer (or its status) streamed back
        as it is ready: a cached verdict at once, a judged one when the judge answers."""
        items = request.items
        if not 1 <= len(items) <= MAX_BATCH:
            await self._abort(
                context,
                Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "invalid_argument",
                    f"items: give 1 to {MAX_BATCH} calls, got {len(items)}",
                ),
            )
        self._service.app.metrics.gateway_batch_size.observe(len(items))
        call_remaining = context.time_remaining()
        tasks = [
            asyncio.create_task(self._serve_item(i, item, context, call_remaining))
            for i, item in enumerate(items)
        ]
        try:
            for ready in asyncio.as_completed(tasks):
                yield await ready
        finally:  # the caller left or the call's deadline passed: what is still asked is cancelled
            for task in tasks:
                task.cancel()

    async def _serve_item(
        self,
        index: int,
        item: mpb.ModelServiceGenerateBatchItem,
        context: Context,
        call_remaining: float | None,
    ) -> mpb.ModelServiceGenerateBatchResponse:
        remaining = call_remaining
        try:
            if item.HasField("timeout_seconds"):
                if not item.timeout_seconds > 0:
                    raise Refused(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "invalid_argument",
                        f"items.{index}.timeout_seconds: above 0, got {item.timeout_seconds}",
                    )
                remaining = (
                    item.timeout_seconds if remaining is None else min(remaining, item.timeout_seconds)
                )
            response = await self._serve(item.request, context, remaining)
        except Refused as exc:
            return mpb.ModelServiceGenerateBatchResponse(
                index=index, code=exc.code.value[0], message=exc.details()
            )
        return mpb.ModelServiceGenerateBatchResponse(index=index, response=response)

    async def _serve(
        self, request: mpb.ModelServiceGenerateRequest, context: Context, remaining: float | None
    ) -> mpb.ModelServiceGenerateResponse:
        """One model call within `remaining` seconds, traced, counted and logged; Refused as its
        status (Generate's, or a batch item's)."""
        metrics = self._service.app.metrics
        processor = self._models.processor_label(request.processor_id)
        model_label = self._models.model_label(request.model)
        started = time.perf_counter()
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
                    response = await self._generate(request, context, remaining)
                except Refused as exc:
                    outcome = exc.outcome
                    span.outcome(outcome)
                    raise
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
            caller_resource(self._service, context)
            if request.count < 1:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", "count: at least 1")
        except Refused as exc:
            await self._abort(context, exc)
        processor = self._models.processor_label(request.processor_id)
        self._service.app.metrics.judge_calls_saved.labels(processor, "precheck").inc(request.count)
        return mpb.ModelServiceReportSavedResponse()

    async def _abort(self, context: Context, exc: Refused) -> NoReturn:
        await context.abort(exc.code, exc.details())
        raise AssertionError("context.abort() returns only by raising")  # pragma: no cover

    async def _generate(
        self, request: mpb.ModelServiceGenerateRequest, context: Context, remaining: float | None
    ) -> mpb.ModelServiceGenerateResponse:
        service = self._service
        resource = caller_resource(service, context)
        if not request.model:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid_argument", "model: give a reference")
        if not self._models.knows(request.model):
            raise Refused(
                grpc.StatusCode.NOT_FOUND,
                "not_in_config",
                f"model {shown(request.model)} is not in the orchestrator's config: the gateway serves "
                "only the models the config names (an agent's models, a processor option naming a "
                "model, a `models` or `prices` key)",
            )
        try:
            model = service.app.models.resolve(request.model, "model")
        except ConfigError as exc:
            raise Refused(grpc.StatusCode.NOT_FOUND, "not_found", str(exc)) from None
        prompt = prompt_of(request)
        answer_schema = schema_of(request)
        settings: dict[str, Any] = {}
        if request.HasField("temperature"):
            settings["temperature"] = request.temperature
        if request.HasField("max_output_tokens"):
            settings["maxOutputTokens"] = request.max_output_tokens
        schema = None
        if answer_schema is not None:
            schema = answer_schema.value
            prompt = [{"role": "system", "content": answer_schema.instruction}, *prompt]
        costs = self._calls.costs(request.run_id, request.model, resource)
        try:
            async with asyncio.timeout(remaining):
                return await self._judging.answer(
                    Question(request, resource, ModelCall(model, prompt, schema, settings, costs))
                )
        except TimeoutError:
            raise Refused(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "deadline",
                f"model {shown(request.model)} did not answer within the call's deadline ({remaining:.3f}s)",
            ) from None
        except LeaseLostError:
            # the calling durable run's ledger write was fenced: another replica holds the run now
            raise Refused(
                grpc.StatusCode.ABORTED,
                "lease_lost",
                "the calling run is no longer held by this replica (another one took it over): "
                "its cost cannot be counted here, so the call is refused",
            ) from None
