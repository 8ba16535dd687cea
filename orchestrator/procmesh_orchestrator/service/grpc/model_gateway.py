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
import functools
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
    messages_valid,
    prompt_of,
    schema_of,
)
from procmesh_orchestrator.service.grpc.gateway_judging import GatewayJudging, Question
from procmesh_orchestrator.service.grpc.gateway_policy import (
    Children,
    Context,
    GatewayModels,
    caller_resource,
    shown,
)
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
        self._children = Children()
        self._judging = GatewayJudging(service, self._calls, models, self._children)

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
            found = self._at_once(request, context, context.time_remaining(), None)
            if found is not None:
                return found
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
        caller = self._caller(context)  # one caller for every item: let in once for the cached ones
        answered: list[mpb.ModelServiceGenerateBatchResponse] = []
        tasks: list[asyncio.Task[mpb.ModelServiceGenerateBatchResponse]] = []
        for i, item in enumerate(items):
            found = self._item_at_once(i, item, context, call_remaining, caller)
            if found is not None:
                answered.append(found)
            else:
                tasks.append(asyncio.create_task(self._serve_item(i, item, context, call_remaining)))
        try:
            for response in answered:
                yield response
            for ready in asyncio.as_completed(tasks):
                yield await ready
        finally:  # the caller left or the call's deadline passed: what is still asked is cancelled
            for task in tasks:
                task.cancel()

    def _item_at_once(
        self,
        index: int,
        item: mpb.ModelServiceGenerateBatchItem,
        context: Context,
        call_remaining: float | None,
        caller: tuple[bool, str | None],
    ) -> mpb.ModelServiceGenerateBatchResponse | None:
        """`_at_once` for a batch's item; None when it goes to `_serve_item`."""
        remaining = call_remaining
        if item.HasField("timeout_seconds"):
            if not item.timeout_seconds > 0:
                return None
            remaining = _within(call_remaining, item.timeout_seconds)
        found = self._at_once(item.request, context, remaining, caller)
        return None if found is None else mpb.ModelServiceGenerateBatchResponse(index=index, response=found)

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
                remaining = _within(remaining, item.timeout_seconds)
            response = await self._serve(item.request, context, remaining)
        except Refused as exc:
            return mpb.ModelServiceGenerateBatchResponse(
                index=index, code=exc.code.value[0], message=exc.details()
            )
        return mpb.ModelServiceGenerateBatchResponse(index=index, response=response)

    def _caller(self, context: Context) -> tuple[bool, str | None]:
        """Whether the caller is let in, and the resource its key is bound to (`caller_resource`)."""
        try:
            return True, caller_resource(self._service, context)
        except Refused:
            return False, None

    def _at_once(
        self,
        request: mpb.ModelServiceGenerateRequest,
        context: Context,
        remaining: float | None,
        caller: tuple[bool, str | None] | None,
    ) -> mpb.ModelServiceGenerateResponse | None:
        """The answer the verdict cache holds in this process for a question asked before, served
        in this step (no task, no timer), counted and logged as `_serve` would; None for any other
        request (a miss, anything refused, tracing on: its spans), which `_serve` then serves.

        A guarded turn re-sends its history, and most of its gateway calls are such questions:
        each served through `_serve` cost the orchestrator about 130 µs of CPU, in the turn's
        first, CPU-bound milliseconds."""
        if not request.model or not request.HasField("schema") or tracing.enabled():
            return None
        started = time.perf_counter()
        let_in, resource = caller if caller is not None else self._caller(context)
        models = self._models
        if not let_in or not models.knows(request.model) or not messages_valid(request):
            return None
        try:
            self._service.app.models.resolve(request.model, "model")
            answer_schema = schema_of(request)
        except (ConfigError, Refused):
            return None
        assert answer_schema is not None  # the request has a schema
        processor = models.processor_label(request.processor_id)
        response = self._judging.at_once(
            request, resource, answer_schema.value, _settings(request), processor
        )
        if response is not None:
            model_label = models.model_label(request.model)
            self._served(request, model_label, processor, "ok", True, started, remaining)
        return response

    async def _serve(
        self, request: mpb.ModelServiceGenerateRequest, context: Context, remaining: float | None
    ) -> mpb.ModelServiceGenerateResponse:
        """One model call within `remaining` seconds, traced, counted and logged; Refused as its
        status (Generate's, or a batch item's)."""
        processor = self._models.processor_label(request.processor_id)
        model_label = self._models.model_label(request.model)
        started = time.perf_counter()
        deadline = None if remaining is None else time.monotonic() + remaining
        parent, attributes = None, None
        if tracing.enabled():
            parent = list(context.invocation_metadata() or ())
            attributes = {
                "gen_ai.request.model": request.model[:_MAX_ATTRIBUTE],
                "procmesh.processor.id": processor,
                "procmesh.run.id": request.run_id[:_MAX_ATTRIBUTE] or None,
            }
        outcome, reused = "ok", False
        try:
            with tracing.span(
                f"procmesh.model_gateway {model_label}", kind="server", attributes=attributes, parent=parent
            ) as span:
                try:
                    response, reused = await self._generate(request, context, remaining)
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
            self._served(request, model_label, processor, outcome, reused, started, remaining)

    def _served(
        self,
        request: mpb.ModelServiceGenerateRequest,
        model_label: str,
        processor: str,
        outcome: str,
        reused: bool,
        started: float,
        remaining: float | None,
    ) -> None:
        """A call served: counted, and logged in one line (INFO; DEBUG for a call the verdict cache
        answered: no model asked, and most of a guarded turn's calls, counted in
        ``procmesh_judge_cache_lookups_total``)."""
        self._children(self._service.app.metrics.gateway_calls, model_label, processor, outcome).inc()
        level = logging.DEBUG if reused else logging.INFO
        if log.isEnabledFor(level):
            log.log(  # the caller's text escaped: a newline in it cannot forge a line
                level,
                "model gateway model=%s processor=%s run=%s outcome=%s%s %.3fs (deadline %s)",
                shown(request.model),
                shown(request.processor_id),
                shown(request.run_id),
                outcome,
                " cached" if reused else "",
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
    ) -> tuple[mpb.ModelServiceGenerateResponse, bool]:
        """The answer, and whether the verdict cache gave it."""
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
        settings = _settings(request)
        schema = None
        if answer_schema is not None:
            schema = answer_schema.value
            prompt = [{"role": "system", "content": answer_schema.instruction}, *prompt]
        costs = functools.partial(self._calls.costs, request.run_id, request.model, resource)
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


def _settings(request: mpb.ModelServiceGenerateRequest) -> dict[str, Any]:
    """The sampling settings the caller gave (``temperature``, ``maxOutputTokens``)."""
    settings: dict[str, Any] = {}
    if request.HasField("temperature"):
        settings["temperature"] = request.temperature
    if request.HasField("max_output_tokens"):
        settings["maxOutputTokens"] = request.max_output_tokens
    return settings


def _within(remaining: float | None, timeout: float) -> float:
    """An item's seconds: its own timeout, never past the batch call's `remaining`."""
    return timeout if remaining is None else min(remaining, timeout)
