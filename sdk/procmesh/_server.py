"""ProcessorServer: hosts processors over gRPC (TCP and unix sockets) with health and reflection."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import json_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry, start_http_server
from pydantic import BaseModel, ValidationError

from procmesh import convert
from procmesh._metrics import SidecarMetrics
from procmesh._processor import (
    HOOK_ARGUMENTS,
    HookEffects,
    MessageList,
    Processor,
    TripWire,
    Writer,
    hook_parameters,
)
from procmesh._version import __version__
from procmesh.errors import (
    InternalError,
    InvalidInputError,
    NotFoundError,
    NotReadyError,
    ProcmeshError,
    UnimplementedError,
)
from procmesh.hooks import BY_NAME as HOOK_BY_NAME
from procmesh.v1 import processor_pb2 as ppb
from procmesh.v1 import processor_pb2_grpc as pgrpc
from procmesh.v1 import types_pb2 as tpb

log = logging.getLogger(__name__)

SERVICE_NAME = "procmesh.v1.ProcessorService"
_Response = TypeVar("_Response")
DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class _Hosted:
    """One hosted processor with what the servicer needs per call, computed once."""

    def __init__(self, processor: Processor) -> None:
        if not processor.id:
            raise ValueError(f"{type(processor).__name__} has no id")
        self.processor = processor
        self.id = processor.id
        self.hooks = {name: getattr(processor, name) for name in type(processor).implemented_hooks()}
        self.params = {name: hook_parameters(fn) for name, fn in self.hooks.items()}
        for name, params in self.params.items():
            unknown = sorted((params or frozenset()) - HOOK_ARGUMENTS[name])
            if unknown:
                raise TypeError(
                    f"{type(processor).__name__}.{name} declares unknown arguments {unknown}; "
                    f"available: {sorted(HOOK_ARGUMENTS[name])}"
                )
        self._calls: dict[tuple[str, str], Any] = {}
        self._latency: dict[str, Any] = {}
        self.options_cache: dict[bytes, Any] = {}

    def observe(self, metrics: SidecarMetrics, hook: str, outcome: str, seconds: float) -> None:
        """Record one hook call (label children cached: this runs per streamed part)."""
        latency = self._latency.get(hook)
        if latency is None:
            latency = self._latency[hook] = metrics.hook_latency.labels(self.id, hook)
        latency.observe(seconds)
        calls = self._calls.get((hook, outcome))
        if calls is None:
            calls = self._calls[(hook, outcome)] = metrics.hook_calls.labels(self.id, hook, outcome)
        calls.inc()

    def options(self, struct: Any) -> Any:
        raw = convert.from_struct(struct)
        model = self.processor.Options
        if model is None:
            return raw
        key = struct.SerializeToString(deterministic=True)
        cached = self.options_cache.get(key)
        if cached is None:
            accepted = _option_names(model)
            unknown = sorted(set(raw) - accepted) if accepted is not None else []
            if unknown:
                raise InvalidInputError(
                    f"invalid options for processor {self.id!r}: unknown keys {unknown} "
                    f"(accepted: {sorted(accepted or ())})"
                )
            try:
                cached = model.model_validate(raw)
            except ValidationError as exc:
                raise InvalidInputError(f"invalid options for processor {self.id!r}: {exc}") from exc
            if len(self.options_cache) < 256:
                self.options_cache[key] = cached
        return cached

    def info(self) -> ppb.ProcessorInfo:
        proc = self.processor
        schema = ""
        if proc.Options is not None and issubclass(proc.Options, BaseModel):
            import json

            schema = json.dumps(proc.Options.model_json_schema(), sort_keys=True)
        return ppb.ProcessorInfo(
            id=self.id,
            name=proc.name or self.id,
            description=proc.description,
            hooks=[HOOK_BY_NAME[h].enum for h in self.hooks],  # type: ignore[misc]
            process_data_parts=proc.process_data_parts,
            options_schema_json=schema,
        )


def _option_names(model: type[BaseModel]) -> set[str] | None:
    """Keys an Options model accepts: field names and aliases (None: any key, extra='allow')."""
    if model.model_config.get("extra") == "allow":
        return None
    names = set()
    for name, field in model.model_fields.items():
        names.add(name)
        if field.alias:
            names.add(field.alias)
        if isinstance(field.validation_alias, str):
            names.add(field.validation_alias)
    return names


def _messages(field: Any) -> list[dict[str, Any]]:
    return [convert.message_from_proto(m) for m in field]


def _fill_messages(field: Any, messages: Any, hook: str) -> None:
    if isinstance(messages, MessageList):
        messages = messages.get_all()
    if not isinstance(messages, list):
        raise InternalError(f"{hook} returned messages of type {type(messages).__name__}; expected a list")
    for msg in messages:
        if not isinstance(msg, dict):
            raise InternalError(f"{hook} returned a message of type {type(msg).__name__}; expected a dict")
        try:
            convert.message_to_proto(msg, field.add())
        except (ValueError, TypeError) as exc:
            raise InternalError(f"{hook} returned a malformed message: {exc}") from exc


def _fill_effects(out: tpb.HookEffects, effects: HookEffects, state: dict[str, Any] | None) -> None:
    # Everything here came from the hook (state included): a conversion failure is the
    # processor's fault (INTERNAL), not a malformed request (INVALID_ARGUMENT).
    try:
        _fill_effects_unchecked(out, effects, state)
    except (ValueError, TypeError, AttributeError) as exc:
        raise InternalError(
            f"processor {effects.processor_id!r} left effects or state that cannot be sent: {exc}"
        ) from exc


def _fill_effects_unchecked(out: tpb.HookEffects, effects: HookEffects, state: dict[str, Any] | None) -> None:
    if effects.abort is not None:
        convert.abort_to_proto(
            {
                "reason": effects.abort.reason,
                "retry": effects.abort.retry,
                "metadata": effects.abort.metadata,
            },
            out.abort,
        )
    for signal in effects.signals:
        convert.signal_to_proto(signal, out.signals.add())
    for chunk in effects.custom_chunks:
        convert.chunk_to_proto(chunk, out.custom_chunks.add())
    for message, detail in effects.violations:
        v = out.violations.add()
        v.message = message
        if detail is not None:
            v.detail.CopyFrom(convert.to_value(detail))
    if state is not None:
        out.state.CopyFrom(convert.to_struct(state))


class _Servicer(pgrpc.ProcessorServiceServicer):
    def __init__(self, hosted: dict[str, _Hosted], metrics: SidecarMetrics) -> None:
        self._hosted = hosted
        self._metrics = metrics
        self.ready = False
        """Hooks are served only once every processor's setup() returned."""

    # -- plumbing --------------------------------------------------------------

    def _lookup(self, ctx: tpb.RunContext, hook: str) -> _Hosted:
        if not self.ready:
            raise NotReadyError("the sidecar is starting or draining; retry when health reports SERVING")
        if not ctx.processor_id:
            raise InvalidInputError("request.context.processor_id is required")
        hosted = self._hosted.get(ctx.processor_id)
        if hosted is None:
            raise NotFoundError(
                f"processor {ctx.processor_id!r} is not hosted here (hosted: {sorted(self._hosted)})"
            )
        if hook not in hosted.hooks:
            raise UnimplementedError(f"processor {hosted.id!r} does not implement {hook}")
        return hosted

    @staticmethod
    def _base_kwargs(hosted: _Hosted, ctx: tpb.RunContext, effects: HookEffects) -> dict[str, Any]:
        return {
            "abort": effects.abort_hook,
            "state": convert.from_struct(ctx.state),
            "options": hosted.options(ctx.options),
            "retry_count": ctx.retry_count,
            "step_number": ctx.step_number,
            "run_id": ctx.run_id,
            "agent_id": ctx.agent_id,
            "thread_id": ctx.thread_id or None,
            "resource_id": ctx.resource_id or None,
            "request_context": convert.from_struct(ctx.request_context),
            "send_signal": effects.send_signal,
            "writer": Writer(effects),
            "report_violation": effects.report_violation,
        }

    async def _call_hook(
        self, hosted: _Hosted, hook: str, kwargs: dict[str, Any], effects: HookEffects
    ) -> Any:
        """Run one hook with the arguments it declares; a TripWire becomes the abort effect."""
        params = hosted.params[hook]
        args = kwargs if params is None else {k: kwargs[k] for k in params}
        started = time.perf_counter()
        outcome = "ok"
        try:
            return await hosted.hooks[hook](**args)
        except TripWire as trip:
            outcome = "abort"
            effects.abort = trip
            return None
        except ProcmeshError as exc:
            outcome = exc.code.name.lower()
            raise
        except Exception as exc:
            outcome = "internal"
            log.exception("processor %s hook %s raised", hosted.id, hook)
            raise InternalError(
                f"processor {hosted.id!r} hook {hook} raised {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            hosted.observe(self._metrics, hook, outcome, time.perf_counter() - started)

    async def _unary(
        self,
        hook: str,
        request: Any,
        context: grpc.aio.ServicerContext[Any, Any],
        build: Callable[[_Hosted, Any, HookEffects], Awaitable[_Response]],
    ) -> _Response:
        try:
            hosted = self._lookup(request.context, hook)
            effects = HookEffects(hosted.id)
            return await build(hosted, request, effects)
        except ProcmeshError as exc:
            await context.abort(exc.code, str(exc))
        except (ValueError, TypeError, KeyError, json_format.Error) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {hook} request: {exc}")
        raise AssertionError("context.abort() returns only by raising")  # pragma: no cover

    # -- RPCs ------------------------------------------------------------------

    async def Describe(self, request: ppb.DescribeRequest, context: Any) -> ppb.DescribeResponse:
        return ppb.DescribeResponse(
            processors=[h.info() for h in self._hosted.values()],
            sdk=f"procmesh-python/{__version__}",
        )

    async def ProcessInput(self, request: ppb.ProcessInputRequest, context: Any) -> ppb.ProcessInputResponse:
        async def build(hosted: _Hosted, req: Any, effects: HookEffects) -> ppb.ProcessInputResponse:
            kwargs = self._base_kwargs(hosted, req.context, effects)
            message_list = MessageList(_messages(req.all_messages))
            kwargs.update(
                messages=_messages(req.messages),
                message_list=message_list,
                system_messages=_messages(req.system_messages),
            )
            result = await self._call_hook(hosted, "process_input", kwargs, effects)
            resp = ppb.ProcessInputResponse()
            if effects.abort is None:
                if message_list.modified:
                    resp.replace_all_messages = True
                    _fill_messages(resp.all_messages, message_list, "process_input")
                if isinstance(result, dict):
                    if "messages" in result:
                        resp.replace_messages = True
                        _fill_messages(resp.messages, result["messages"], "process_input")
                    if "system_messages" in result:
                        resp.replace_system_messages = True
                        _fill_messages(resp.system_messages, result["system_messages"], "process_input")
                elif isinstance(result, list):
                    resp.replace_messages = True
                    _fill_messages(resp.messages, result, "process_input")
                elif result is not None and result is not message_list:
                    raise InternalError(
                        f"process_input returned {type(result).__name__}; expected a list of messages, "
                        "a dict with messages/system_messages, the message_list or None"
                    )
            _fill_effects(resp.effects, effects, kwargs["state"])
            return resp

        return await self._unary("process_input", request, context, build)

    async def ProcessInputStep(
        self, request: ppb.ProcessInputStepRequest, context: Any
    ) -> ppb.ProcessInputStepResponse:
        async def build(hosted: _Hosted, req: Any, effects: HookEffects) -> ppb.ProcessInputStepResponse:
            kwargs = self._base_kwargs(hosted, req.context, effects)
            messages = _messages(req.messages)
            message_list = MessageList(messages)
            tool_choice: Any = req.tool_choice.mode or None
            if req.tool_choice.mode == "tool":
                tool_choice = {"type": "tool", "toolName": req.tool_choice.tool_name}
            kwargs.update(
                messages=messages,
                message_list=message_list,
                system_messages=_messages(req.system_messages),
                model=req.model,
                tools=[_tool_from_proto(t) for t in req.tools],
                tool_choice=tool_choice,
                active_tools=list(req.active_tools),
                provider_options=convert.from_struct(req.provider_options),
                model_settings=convert.from_struct(req.model_settings),
                steps=[convert.step_from_proto(s) for s in req.steps],
            )
            result = await self._call_hook(hosted, "process_input_step", kwargs, effects)
            resp = ppb.ProcessInputStepResponse()
            if effects.abort is None:
                if message_list.modified:
                    resp.replace_messages = True
                    _fill_messages(resp.messages, message_list, "process_input_step")
                if isinstance(result, list | MessageList) and result is not message_list:
                    resp.replace_messages = True
                    del resp.messages[:]
                    _fill_messages(resp.messages, result, "process_input_step")
                elif isinstance(result, dict):
                    _fill_step_overrides(resp, result)
                elif result is not None and result is not message_list:
                    raise InternalError(
                        f"process_input_step returned {type(result).__name__}; expected a dict of "
                        "step overrides, a list of messages, the message_list or None"
                    )
            _fill_effects(resp.effects, effects, kwargs["state"])
            return resp

        return await self._unary("process_input_step", request, context, build)

    async def ProcessLLMRequest(
        self, request: ppb.ProcessLLMRequestRequest, context: Any
    ) -> ppb.ProcessLLMRequestResponse:
        async def build(hosted: _Hosted, req: Any, effects: HookEffects) -> ppb.ProcessLLMRequestResponse:
            kwargs = self._base_kwargs(hosted, req.context, effects)
            kwargs.update(
                prompt=convert.prompt_from_proto(req.prompt),
                model=req.model,
                steps=[convert.step_from_proto(s) for s in req.steps],
            )
            result = await self._call_hook(hosted, "process_llm_request", kwargs, effects)
            resp = ppb.ProcessLLMRequestResponse()
            if effects.abort is None and result is not None:
                if not isinstance(result, dict):
                    raise InternalError(
                        f"process_llm_request returned {type(result).__name__}; "
                        "expected {'prompt': [...]} and/or {'response': [chunks]} or None"
                    )
                if "prompt" in result:
                    resp.replace_prompt = True
                    convert.prompt_to_proto(result["prompt"], resp.prompt)
                if result.get("response") is not None:
                    resp.has_cached_response = True
                    for chunk in result["response"]:
                        convert.chunk_to_proto(chunk, resp.cached_response.add())
            _fill_effects(resp.effects, effects, kwargs["state"])
            return resp

        return await self._unary("process_llm_request", request, context, build)

    async def ProcessLLMResponse(
        self, request: ppb.ProcessLLMResponseRequest, context: Any
    ) -> ppb.ProcessLLMResponseResponse:
        async def build(hosted: _Hosted, req: Any, effects: HookEffects) -> ppb.ProcessLLMResponseResponse:
            kwargs = self._base_kwargs(hosted, req.context, effects)
            kwargs.update(
                chunks=[convert.chunk_from_proto(c) for c in req.chunks],
                model=req.model,
                steps=[convert.step_from_proto(s) for s in req.steps],
                from_cache=req.from_cache,
            )
            await self._call_hook(hosted, "process_llm_response", kwargs, effects)
            resp = ppb.ProcessLLMResponseResponse()
            _fill_effects(resp.effects, effects, kwargs["state"])
            return resp

        return await self._unary("process_llm_response", request, context, build)

    async def ProcessOutputStep(
        self, request: ppb.ProcessOutputStepRequest, context: Any
    ) -> ppb.ProcessOutputStepResponse:
        async def build(hosted: _Hosted, req: Any, effects: HookEffects) -> ppb.ProcessOutputStepResponse:
            kwargs = self._base_kwargs(hosted, req.context, effects)
            messages = _messages(req.messages)
            message_list = MessageList(messages)
            kwargs.update(
                messages=messages,
                message_list=message_list,
                system_messages=_messages(req.system_messages),
                text=req.text,
                tool_calls=[
                    {
                        "toolCallId": c.tool_call_id,
                        "toolName": c.tool_name,
                        "args": convert.from_value(c.args),
                    }
                    for c in req.tool_calls
                ]
                or None,
                finish_reason=req.finish_reason,
                usage=convert.usage_from_proto(req.usage),
                steps=[convert.step_from_proto(s) for s in req.steps],
            )
            result = await self._call_hook(hosted, "process_output_step", kwargs, effects)
            resp = ppb.ProcessOutputStepResponse()
            if effects.abort is None:
                _fill_replacement(resp, result, message_list, "process_output_step")
            _fill_effects(resp.effects, effects, kwargs["state"])
            return resp

        return await self._unary("process_output_step", request, context, build)

    async def ProcessToolResult(
        self, request: ppb.ProcessToolResultRequest, context: Any
    ) -> ppb.ProcessToolResultResponse:
        async def build(hosted: _Hosted, req: Any, effects: HookEffects) -> ppb.ProcessToolResultResponse:
            kwargs = self._base_kwargs(hosted, req.context, effects)
            kwargs.update(
                messages=_messages(req.messages),
                tool_name=req.tool_name,
                tool_call_id=req.tool_call_id,
                args=convert.from_value(req.args),
                result=convert.from_value(req.result),
                provider_executed=req.provider_executed,
                steps=[convert.step_from_proto(s) for s in req.steps],
            )
            result = await self._call_hook(hosted, "process_tool_result", kwargs, effects)
            resp = ppb.ProcessToolResultResponse()
            if effects.abort is None and result is not None:
                resp.replace_result = True
                try:
                    resp.result.CopyFrom(convert.to_value(result))
                except TypeError as exc:
                    raise InternalError(f"process_tool_result returned a non-JSON result: {exc}") from exc
            _fill_effects(resp.effects, effects, kwargs["state"])
            return resp

        return await self._unary("process_tool_result", request, context, build)

    async def ProcessOutputResult(
        self, request: ppb.ProcessOutputResultRequest, context: Any
    ) -> ppb.ProcessOutputResultResponse:
        async def build(hosted: _Hosted, req: Any, effects: HookEffects) -> ppb.ProcessOutputResultResponse:
            kwargs = self._base_kwargs(hosted, req.context, effects)
            messages = _messages(req.messages)
            message_list = MessageList(messages)
            res = req.result
            kwargs.update(
                messages=messages,
                message_list=message_list,
                result={
                    "text": res.text,
                    "usage": convert.usage_from_proto(res.usage),
                    "finishReason": res.finish_reason,
                    "steps": [convert.step_from_proto(s) for s in res.steps],
                },
            )
            result = await self._call_hook(hosted, "process_output_result", kwargs, effects)
            resp = ppb.ProcessOutputResultResponse()
            if effects.abort is None:
                _fill_replacement(resp, result, message_list, "process_output_result")
            _fill_effects(resp.effects, effects, kwargs["state"])
            return resp

        return await self._unary("process_output_result", request, context, build)

    async def ProcessAPIError(
        self, request: ppb.ProcessAPIErrorRequest, context: Any
    ) -> ppb.ProcessAPIErrorResponse:
        async def build(hosted: _Hosted, req: Any, effects: HookEffects) -> ppb.ProcessAPIErrorResponse:
            kwargs = self._base_kwargs(hosted, req.context, effects)
            messages = _messages(req.messages)
            message_list = MessageList(messages)
            err = req.error
            kwargs.update(
                error={
                    "status": err.status,
                    "message": err.message,
                    "body": err.body,
                    "retryable": err.retryable,
                    "id": err.id or None,
                    "details": convert.from_struct(err.details),
                },
                messages=messages,
                message_list=message_list,
                steps=[convert.step_from_proto(s) for s in req.steps],
            )
            result = await self._call_hook(hosted, "process_api_error", kwargs, effects)
            resp = ppb.ProcessAPIErrorResponse()
            if effects.abort is None:
                if message_list.modified:
                    resp.replace_messages = True
                    _fill_messages(resp.messages, message_list, "process_api_error")
                if isinstance(result, dict):
                    resp.retry = bool(result.get("retry", False))
                elif result is not None:
                    raise InternalError(
                        f"process_api_error returned {type(result).__name__}; "
                        "expected {'retry': bool} or None"
                    )
            _fill_effects(resp.effects, effects, kwargs["state"])
            return resp

        return await self._unary("process_api_error", request, context, build)

    async def ExecuteTool(self, request: ppb.ExecuteToolRequest, context: Any) -> ppb.ExecuteToolResponse:
        async def build(hosted: _Hosted, req: Any, effects: HookEffects) -> ppb.ExecuteToolResponse:
            kwargs = self._base_kwargs(hosted, req.context, effects)
            kwargs.update(
                tool_name=req.tool_name,
                tool_call_id=req.tool_call_id,
                args=convert.from_value(req.args),
                messages=_messages(req.messages),
            )
            result = await self._call_hook(hosted, "execute_tool", kwargs, effects)
            resp = ppb.ExecuteToolResponse()
            if effects.abort is None:
                try:
                    resp.result.CopyFrom(convert.to_value(result))
                except TypeError as exc:
                    raise InternalError(f"execute_tool returned a non-JSON result: {exc}") from exc
            _fill_effects(resp.effects, effects, kwargs["state"])
            return resp

        return await self._unary("execute_tool", request, context, build)

    async def ProcessOutputStream(
        self, request_iterator: AsyncIterator[ppb.ProcessOutputStreamRequest], context: Any
    ) -> AsyncIterator[ppb.ProcessOutputStreamResponse]:
        hook = "process_output_stream"
        hosted: _Hosted | None = None
        kwargs: dict[str, Any] = {}
        stream_parts: list[dict[str, Any]] = []
        try:
            async for req in request_iterator:
                if hosted is None:
                    hosted = self._lookup(req.context, hook)
                    effects = HookEffects(hosted.id)
                    kwargs = self._base_kwargs(hosted, req.context, effects)
                    kwargs["stream_parts"] = stream_parts
                results = []
                aborted = False
                for item in req.parts:
                    res = ppb.StreamPartResult(seq=item.seq)
                    part = convert.chunk_from_proto(item.part)
                    if part["type"].startswith("data-") and not hosted.processor.process_data_parts:
                        res.part.CopyFrom(item.part)
                        results.append(res)
                        continue
                    stream_parts.append(part)
                    effects = HookEffects(hosted.id)
                    kwargs.update(
                        part=part,
                        abort=effects.abort_hook,
                        send_signal=effects.send_signal,
                        writer=Writer(effects),
                        report_violation=effects.report_violation,
                    )
                    out = await self._call_hook(hosted, hook, kwargs, effects)
                    if effects.abort is None and out is not None:
                        # a list turns one part into several (empty: dropped)
                        parts = out if isinstance(out, list) else [out]
                        for i, chunk in enumerate(parts):
                            if not isinstance(chunk, dict) or not isinstance(chunk.get("type"), str):
                                raise InternalError(
                                    f"{hook} returned {type(chunk).__name__}; "
                                    "expected a chunk dict, a list of them, or None"
                                )
                            try:
                                convert.chunk_to_proto(chunk, res.part if i == 0 else res.extra_parts.add())
                            except (ValueError, TypeError) as exc:
                                raise InternalError(f"{hook} returned a malformed chunk: {exc}") from exc
                    _fill_effects(res.effects, effects, None)
                    results.append(res)
                    if effects.abort is not None:
                        aborted = True
                        break
                yield ppb.ProcessOutputStreamResponse(results=results)
                if aborted:
                    break
            end = ppb.StreamEnd(state=convert.to_struct(kwargs.get("state")))
            yield ppb.ProcessOutputStreamResponse(end=end)
        except ProcmeshError as exc:
            await context.abort(exc.code, str(exc))
        except (ValueError, TypeError, KeyError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed {hook} request: {exc}")


def _tool_from_proto(tool: Any) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "inputSchema": convert.from_struct(tool.input_schema),
    }


def _fill_step_overrides(resp: ppb.ProcessInputStepResponse, result: dict[str, Any]) -> None:
    unknown = set(result) - {
        "messages",
        "system_messages",
        "model",
        "tools",
        "tool_choice",
        "active_tools",
        "provider_options",
        "model_settings",
    }
    if unknown:
        raise InternalError(f"process_input_step returned unknown keys {sorted(unknown)}")
    if "messages" in result:
        resp.replace_messages = True
        del resp.messages[:]
        _fill_messages(resp.messages, result["messages"], "process_input_step")
    if "system_messages" in result:
        resp.replace_system_messages = True
        _fill_messages(resp.system_messages, result["system_messages"], "process_input_step")
    if result.get("model"):
        resp.model = str(result["model"])
    if "tools" in result:
        resp.replace_tools = True
        for tool in result["tools"]:
            t = resp.tools.add()
            t.name = tool["name"]
            t.description = tool.get("description", "")
            t.input_schema.CopyFrom(convert.to_struct(tool.get("inputSchema")))
    choice = result.get("tool_choice")
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise InternalError(f"process_input_step returned tool_choice {choice!r}")
        resp.tool_choice.mode = choice
    elif isinstance(choice, dict):
        resp.tool_choice.mode = "tool"
        resp.tool_choice.tool_name = choice.get("toolName", "")
    if "active_tools" in result:
        resp.replace_active_tools = True
        resp.active_tools.extend(result["active_tools"])
    if result.get("provider_options"):
        resp.provider_options.CopyFrom(convert.to_struct(result["provider_options"]))
    if result.get("model_settings"):
        resp.model_settings.CopyFrom(convert.to_struct(result["model_settings"]))


def _fill_replacement(resp: Any, result: Any, message_list: MessageList, hook: str) -> None:
    """Array-style return (or in-place message_list edits) of output hooks."""
    if isinstance(result, list | MessageList) and result is not message_list:
        if isinstance(result, list) and not result:
            return  # the seeds' examples return [] to mean "no change"
        resp.replace_messages = True
        _fill_messages(resp.messages, result, hook)
    elif message_list.modified:
        resp.replace_messages = True
        _fill_messages(resp.messages, message_list, hook)
    elif result is not None and result is not message_list:
        raise InternalError(f"{hook} returned {type(result).__name__}; expected a list of messages or None")


class ProcessorServer:
    """A gRPC server hosting one or more processors, with health and reflection.

    Use it as an async context manager, or call `start()` and `stop()`.

    Args:
        processors: The processors to host (ids must be unique).
        addresses: Where to listen: ``"host:port"`` (port 0 picks a free port)
            or ``"unix:///path.sock"``. Several may be given.
        metrics_port: Serve Prometheus metrics over HTTP on this port (None: off).
        registry: Collector registry for the metrics (a private one by default).
        max_message_bytes: Largest request or response accepted.
        credentials: Server TLS credentials (`server_credentials()`); plaintext when None.
    """

    def __init__(
        self,
        processors: Sequence[Processor],
        addresses: Sequence[str] = ("127.0.0.1:0",),
        *,
        metrics_port: int | None = None,
        registry: CollectorRegistry | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        credentials: grpc.ServerCredentials | None = None,
    ) -> None:
        hosted: dict[str, _Hosted] = {}
        for proc in processors:
            entry = _Hosted(proc)
            if entry.id in hosted:
                raise ValueError(f"two processors share the id {entry.id!r}")
            if not entry.hooks:
                raise ValueError(f"processor {entry.id!r} implements no hook")
            hosted[entry.id] = entry
        if not hosted:
            raise ValueError("ProcessorServer needs at least one processor")
        self._hosted = hosted
        self._requested = list(addresses)
        self._credentials = credentials
        self._metrics_port = metrics_port
        self.registry = registry or CollectorRegistry()
        self._metrics = SidecarMetrics(self.registry)
        self._max_bytes = max_message_bytes
        self._server: grpc.aio.Server | None = None
        self._health = health_aio.HealthServicer()
        self.addresses: list[str] = []
        self.metrics_server: Any = None

    @property
    def processor_ids(self) -> list[str]:
        """The ids of the hosted processors."""
        return list(self._hosted)

    async def start(self) -> None:
        """Run every processor's setup, bind the addresses, then report SERVING."""
        options = [
            ("grpc.max_receive_message_length", self._max_bytes),
            ("grpc.max_send_message_length", self._max_bytes),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(options=options)
        self._servicer = _Servicer(self._hosted, self._metrics)
        pgrpc.add_ProcessorServiceServicer_to_server(self._servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            [
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            server,
        )
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        for addr in self._requested:
            if addr.startswith("unix:"):
                path = _unix_path(addr)
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)  # a stale socket from a previous run
                self._bind(server, addr)
                self.addresses.append(addr)
            else:
                port = self._bind(server, addr)
                host = addr.rsplit(":", 1)[0]
                self.addresses.append(f"{host}:{port}")
        await server.start()
        self._server = server
        for addr in self.addresses:
            if addr.startswith("unix:"):
                os.chmod(_unix_path(addr), 0o660)
        if self._metrics_port is not None:
            self.metrics_server, _ = start_http_server(self._metrics_port, registry=self.registry)
        try:
            for hosted in self._hosted.values():
                await hosted.processor.setup()
        except BaseException:
            await self.stop(grace=0)  # a failed setup leaves nothing bound
            raise
        self._servicer.ready = True
        for service in ("", SERVICE_NAME):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving processors %s on %s", self.processor_ids, ", ".join(self.addresses))

    def _bind(self, server: grpc.aio.Server, address: str) -> int:
        if self._credentials is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, self._credentials)

    async def stop(self, grace: float = 5.0) -> None:
        """Report NOT_SERVING, let in-flight calls finish within `grace`, then tear down."""
        if self._server is None:
            return
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace)
        self._server = None
        for hosted in self._hosted.values():
            try:
                await hosted.processor.teardown()
            except Exception:
                log.exception("teardown of %s failed", hosted.id)
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server = None
        for addr in self.addresses:
            if addr.startswith("unix:"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(_unix_path(addr))

    async def wait_for_termination(self) -> None:
        """Block until the server stops."""
        if self._server is not None:
            await self._server.wait_for_termination()

    async def __aenter__(self) -> ProcessorServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop(grace=1.0)


def server_credentials(cert: str, key: str, client_ca: str | None = None) -> grpc.ServerCredentials:
    """TLS credentials from PEM files; with `client_ca`, clients must present a certificate (mTLS)."""
    with open(cert, "rb") as f:
        cert_pem = f.read()
    with open(key, "rb") as f:
        key_pem = f.read()
    ca_pem = None
    if client_ca is not None:
        with open(client_ca, "rb") as f:
            ca_pem = f.read()
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=ca_pem is not None
    )


def channel_credentials(ca: str, cert: str | None = None, key: str | None = None) -> grpc.ChannelCredentials:
    """Client TLS credentials from PEM files; `cert` and `key` add a client certificate (mTLS)."""
    with open(ca, "rb") as f:
        ca_pem = f.read()
    cert_pem = key_pem = None
    if cert is not None and key is not None:
        with open(cert, "rb") as f:
            cert_pem = f.read()
        with open(key, "rb") as f:
            key_pem = f.read()
    return grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)


def _unix_path(address: str) -> str:
    if address.startswith("unix://"):
        return address[len("unix://") :]
    return address[len("unix:") :]
