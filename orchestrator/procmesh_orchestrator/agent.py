"""The agent loop: preparation, model steps with their processor hooks, finalization (SPEC §2)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from procmesh import convert
from procmesh.v1 import processor_pb2 as ppb
from procmesh_orchestrator import messages as msgs
from procmesh_orchestrator.errors import (
    APICallError,
    OrchestratorError,
    ProcessorFailedError,
    RunTimeoutError,
    TripwireAbort,
)
from procmesh_orchestrator.messages import RunMessages
from procmesh_orchestrator.metrics import OrchestratorMetrics
from procmesh_orchestrator.models import ModelProvider, ModelRequest
from procmesh_orchestrator.processors import (
    Effects,
    HookCaller,
    LaneItem,
    OutputPipeline,
    ParallelGroup,
    ProcessorHandle,
    RunLaneItem,
    RunScope,
    expand_lane,
)
from procmesh_orchestrator.tools import StaticTool

log = logging.getLogger(__name__)

Chunk = dict[str, Any]
ViolationCallback = Callable[[dict[str, Any]], None]

DEFAULT_ERROR_RETRY_CAP = 3
RUN_DEADLINE_GRACE = 0.05


@dataclass(frozen=True)
class Lanes:
    """The resolved processor lanes of a call."""

    input: tuple[LaneItem, ...] = ()
    output: tuple[LaneItem, ...] = ()
    error: tuple[LaneItem, ...] = ()


@dataclass(frozen=True)
class RunLanes:
    """One run's lanes: per-call lists applied, workflow conditions decided."""

    input: tuple[RunLaneItem, ...]
    output: tuple[RunLaneItem, ...]
    error: tuple[RunLaneItem, ...]


@dataclass
class AgentSpec:
    """A resolved agent: what the loop needs, with processors bound to their sidecars."""

    id: str
    model: ModelProvider
    instructions: str = ""
    models: dict[str, ModelProvider] = field(default_factory=dict)
    tools: dict[str, StaticTool] = field(default_factory=dict)
    max_steps: int = 5
    max_processor_retries: int | None = None
    lanes: Lanes = field(default_factory=Lanes)
    """The resolved lanes; `error` already holds the default error processors (SPEC §5)."""
    warned_implicit_cap: bool = False


@dataclass
class CallOptions:
    """Per-call options; None means the agent's value. A lane list replaces the agent's."""

    max_steps: int | None = None
    max_processor_retries: int | None = None
    input_processors: list[LaneItem] | None = None
    output_processors: list[LaneItem] | None = None
    error_processors: list[LaneItem] | None = None
    request_context: dict[str, Any] = field(default_factory=dict)
    on_violation: ViolationCallback | None = None
    timeout: float | None = None
    """Seconds the whole run may take; propagates to every processor call as its deadline."""
    resource_id: str = ""
    """Who the run is for (a user, an org): processors get it (response-cache scopes by it)."""
    thread_id: str = ""
    """The conversation the run belongs to."""


@dataclass
class RunResult:
    """What a run produced (the `generate()` result; a stream resolves to it)."""

    run_id: str
    text: str
    finish_reason: str
    steps: list[dict[str, Any]]
    tripwire: dict[str, Any] | None
    usage: dict[str, int]
    response_messages: list[dict[str, Any]]
    violations: list[dict[str, Any]]
    error: str | None = None

    @property
    def assistant_metadata(self) -> dict[str, Any]:
        """Metadata processors attached to the response's assistant messages (merged)."""
        merged: dict[str, Any] = {}
        for msg in self.response_messages:
            if msg.get("role") == "assistant":
                meta = (msg.get("content") or {}).get("metadata") or {}
                merged.update({k: v for k, v in meta.items() if not k.startswith("__")})
        return merged


@dataclass
class _StepOutcome:
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    usage: dict[str, int] = field(default_factory=dict)
    raw_chunks: list[Chunk] = field(default_factory=list)
    abort: TripwireAbort | None = None
    from_cache: bool = False


@dataclass
class _StepConfig:
    model: ModelProvider
    tools: list[dict[str, Any]]
    tool_choice: Any
    active_tools: list[str] | None = None
    provider_options: dict[str, Any] = field(default_factory=dict)
    model_settings: dict[str, Any] = field(default_factory=dict)


def _dedupe(handles: Iterable[RunLaneItem]) -> list[RunLaneItem]:
    """A processor listed in several lanes runs once, at its first place."""
    seen: set[str] = set()
    out = []
    for h in handles:
        if h.key not in seen:
            seen.add(h.key)
            out.append(h)
    return out


def _normalize_input(value: str | list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Caller input as (system messages, conversation messages)."""
    if isinstance(value, str):
        return [], [msgs.text_message("user", value)]
    systems: list[dict[str, Any]] = []
    convo: list[dict[str, Any]] = []
    for item in value:
        if "content" in item and isinstance(item["content"], dict):
            msg = dict(item)
            msg.setdefault("id", msgs.new_id())
        else:
            role = item.get("role", "user")
            if role not in ("user", "assistant", "system"):
                raise ValueError(f"input message role must be user, assistant or system, got {role!r}")
            msg = msgs.text_message(role, str(item.get("text", item.get("content", ""))))
        (systems if msg["role"] == "system" else convo).append(msg)
    return systems, convo


class _Run:
    """One generate()/stream() call."""

    def __init__(
        self,
        agent: AgentSpec,
        input: str | list[dict[str, Any]],
        options: CallOptions,
        *,
        streaming: bool,
        emit: Callable[[Chunk], None] | None,
        metrics: OrchestratorMetrics,
    ) -> None:
        self.agent = agent
        self.input = input
        self.options = options
        self.streaming = streaming
        self._emit = emit
        self.metrics = metrics
        self.run_id = str(uuid.uuid4())
        self.violations: list[dict[str, Any]] = []
        deadline = time.monotonic() + options.timeout if options.timeout else None
        self.scope = RunScope(
            run_id=self.run_id,
            agent_id=agent.id,
            request_context=options.request_context,
            on_violation=self._violation,
            deadline=deadline,
            thread_id=options.thread_id,
            resource_id=options.resource_id,
        )
        self.caller = HookCaller(self.scope, self._count_call, self._observe_call)
        rc = options.request_context
        # per-call lists replace the agent's; workflow conditions are decided once, from the request context
        self.lanes = RunLanes(
            input=expand_lane(
                options.input_processors if options.input_processors is not None else agent.lanes.input, rc
            ),
            output=expand_lane(
                options.output_processors if options.output_processors is not None else agent.lanes.output, rc
            ),
            error=expand_lane(
                options.error_processors if options.error_processors is not None else agent.lanes.error, rc
            ),
        )
        self.pipeline = OutputPipeline(self.caller, list(self.lanes.output), self._stream_signals)
        self.ml = RunMessages()
        self.system: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.usage = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}
        self.max_steps = options.max_steps or agent.max_steps
        self.max_retries = (
            options.max_processor_retries
            if options.max_processor_retries is not None
            else agent.max_processor_retries
        )
        self.tool_owners: dict[str, RunLaneItem] = {}
        """Tools processors added to a step and run themselves (ExecuteTool), by name."""
        self.model_requests: list[ModelRequest] = []

    # -- small helpers ----------------------------------------------------------

    def _count_call(self, handle: ProcessorHandle, hook: str, outcome: str) -> None:
        self.metrics.processor_call(handle.processor_id, hook, outcome)

    def _observe_call(self, handle: ProcessorHandle, hook: str, seconds: float) -> None:
        self.metrics.processor_call_duration.labels(handle.processor_id, hook).observe(seconds)

    def _violation(self, processor_id: str, message: str, detail: Any) -> None:
        entry = {"processorId": processor_id, "message": message, "detail": detail}
        self.violations.append(entry)
        self.metrics.violations.labels(processor_id).inc()
        if self.options.on_violation is not None:
            try:
                self.options.on_violation(entry)
            except Exception:
                log.exception("onViolation callback raised (ignored)")

    def _aborted(self, abort: TripwireAbort) -> TripwireAbort:
        """Record an abort (onViolation fires for every abort) and return it to raise."""
        self.metrics.tripwires.labels(abort.processor_id, abort.hook).inc()
        self._violation(abort.processor_id, abort.reason, abort.metadata)
        return abort

    def emit(self, chunk: Chunk) -> None:
        """Send a chunk to the caller (stream only)."""
        if self._emit is not None:
            kind = chunk["type"]
            self.metrics.chunks.labels("data" if kind.startswith("data-") else kind).inc()
            self._emit(chunk)

    async def _emit_chunks(self, chunks: list[Chunk]) -> None:
        """Custom chunks and signals from hooks: through the output processors, then to the caller."""
        if not chunks or not self.streaming:
            return

        async def source() -> AsyncIterator[Chunk]:
            for chunk in chunks:
                yield chunk

        async def sink(chunk: Chunk) -> None:
            self.emit(chunk)

        abort = await self.pipeline.run(source(), sink)
        if abort is not None:
            raise self._aborted(abort)

    def _signal_chunks(self, signals: list[dict[str, Any]]) -> list[Chunk]:
        """Add signals to the message list; the data-signal chunks announcing them."""
        out: list[Chunk] = []
        for signal in signals:
            _, data = self.ml.add_signal(signal)
            out.append({"type": "data-signal", "data": data, "transient": True})
        return out

    def _stream_signals(self, signals: list[dict[str, Any]]) -> list[Chunk]:
        chunks = self._signal_chunks(signals)
        return chunks if self.streaming else []

    async def _apply(self, effects: Effects, *, can_stream: bool = True) -> None:
        """Apply a unary hook's effects in order: signals, custom chunks, then the abort."""
        out = self._signal_chunks(effects.signals)
        out.extend(effects.custom_chunks)
        if can_stream:
            await self._emit_chunks(out)
        if effects.abort is not None:
            raise self._aborted(effects.abort)

    def _fill(self, field_: Any, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            convert.message_to_proto(m, field_.add())

    def _steps_proto(self, field_: Any) -> None:
        for step in self.steps:
            convert.step_to_proto(step, field_.add())

    @staticmethod
    def _returned(field_: Any) -> list[dict[str, Any]]:
        return [convert.message_from_proto(m) for m in field_]

    # -- the run ------------------------------------------------------------------

    async def execute(self) -> tuple[RunResult, BaseException | None]:
        started = time.perf_counter()
        self.emit({"type": "start", "payload": {"runId": self.run_id}})
        tripwire: TripwireAbort | None = None
        failure: BaseException | None = None
        finish_reason = "stop"
        try:
            # Processor calls are cut at the deadline itself and name the processor that was slow;
            # the run-wide timer fires just after, for whatever else still runs (the model, tools).
            timeout = self.options.timeout + RUN_DEADLINE_GRACE if self.options.timeout else None
            async with asyncio.timeout(timeout):
                finish_reason = await self._prepare_and_loop()
        except TripwireAbort as abort:
            tripwire = abort
        except (APICallError, ProcessorFailedError) as exc:
            failure = exc
        except TimeoutError:
            failure = RunTimeoutError(self.options.timeout or 0)
        text = self._text()
        if tripwire is not None:
            finish_reason = "other"
            self.emit({"type": "tripwire", "payload": tripwire.as_dict()})
        else:
            if failure is not None:
                finish_reason = "error"
                self.emit({"type": "error", "payload": {"message": str(failure)}})
            try:
                if not isinstance(failure, RunTimeoutError):  # no budget left for finalization
                    text, tripwire = await self._finalize(text, finish_reason)
            except (APICallError, ProcessorFailedError) as exc:
                failure = failure or exc
                finish_reason = "error"
            if tripwire is not None:
                finish_reason = "other"
                self.emit({"type": "tripwire", "payload": tripwire.as_dict()})
            else:
                result_meta = RunResult(
                    self.run_id, text, finish_reason, [], None, self.usage, self.ml.view(msgs.RESPONSE), []
                ).assistant_metadata
                payload: dict[str, Any] = {"finishReason": finish_reason, "usage": self.usage}
                if result_meta:
                    payload["metadata"] = result_meta
                self.emit({"type": "finish", "payload": payload})
        result = RunResult(
            run_id=self.run_id,
            text=text,
            finish_reason=finish_reason,
            steps=self.steps,
            tripwire=tripwire.as_dict() if tripwire else None,
            usage=self.usage,
            response_messages=self.ml.view(msgs.RESPONSE),
            violations=self.violations,
            error=str(failure) if failure else None,
        )
        self.metrics.runs.labels(self.agent.id, finish_reason).inc()
        self.metrics.run_duration.labels(self.agent.id).observe(time.perf_counter() - started)
        return result, failure

    def _text(self) -> str:
        """generate: every step's text joined; stream: the last step's text (as the reference reports)."""
        texts = [msgs.message_text(m) for m in self.ml.view(msgs.RESPONSE) if m.get("role") == "assistant"]
        if not texts:
            return ""
        return "".join(texts) if not self.streaming else texts[-1]

    async def _prepare_and_loop(self) -> str:
        systems, convo = _normalize_input(self.input)
        if self.agent.instructions:
            self.system.append(msgs.text_message("system", self.agent.instructions))
        self.system.extend(systems)
        for m in convo:
            self.ml.add(m, msgs.INPUT)
        await self._process_input()
        return await self._loop()

    async def _process_input(self) -> None:
        for handle in self.lanes.input:
            if not handle.has("process_input"):
                continue
            before = self.ml.view(msgs.INPUT)
            req = ppb.ProcessInputRequest()
            self._fill(req.messages, before)
            self._fill(req.all_messages, self.ml.items)
            self._fill(req.system_messages, self.system)
            answer = await self.caller.call(handle, "process_input", req)
            if answer is None:
                continue
            resp, effects = answer
            if effects.abort is None:
                if resp.replace_all_messages:
                    self.system.extend(self.ml.replace_all(self._returned(resp.all_messages), msgs.INPUT))
                    before = self.ml.view(msgs.INPUT)
                if resp.replace_system_messages:
                    self.system = self._returned(resp.system_messages)
                if resp.replace_messages:
                    self.system.extend(self.ml.apply(before, self._returned(resp.messages), msgs.INPUT))
            await self._apply(effects, can_stream=False)

    def _may_retry_step(self) -> bool:
        if self.max_retries is None:
            log.warning(
                "agent %s: a processor asked for a retry but maxProcessorRetries is not set; "
                "treating it as an abort",
                self.agent.id,
            )
            return False
        if self.scope.retry_count >= self.max_retries:
            self.metrics.retry_budget_exhausted.labels("step").inc()
            return False
        return True

    def _retry_with_feedback(self, reason: str) -> None:
        """Append the reason after the conversation as a persisted <system-reminder> signal."""
        self.ml.add_signal({"type": "reactive", "contents": reason})
        self.scope.retry_count += 1
        self.metrics.retries.labels("step").inc()

    async def _loop(self) -> str:
        loop_system = list(self.system)
        step_number = 0
        while True:
            self.scope.step_number = step_number
            self.system = list(loop_system)  # processInputStep system changes last one step
            cfg = _StepConfig(
                model=self.agent.model,
                tools=[t.spec() for t in self.agent.tools.values()],
                tool_choice="auto" if self.agent.tools else None,
            )
            try:
                await self._input_step(cfg)
            except TripwireAbort as abort:
                if abort.retry and self._may_retry_step():
                    self._retry_with_feedback(abort.reason)
                    continue
                raise
            prompt = msgs.build_prompt(self.system, self.ml.items)
            prompt, cached = await self._llm_request(prompt, cfg)
            try:
                outcome = await self._model_step(prompt, cfg, cached)
            except APICallError as err:
                self.steps.append(self._step_record(step_number, _StepOutcome(finish_reason="error")))
                if await self._api_error(err):
                    continue
                raise
            if outcome.abort is not None:
                if outcome.text:
                    self.ml.add(self._assistant_message(outcome.text, []), msgs.RESPONSE)
                raise self._aborted(outcome.abort)
            self._add_usage(outcome.usage)
            await self._llm_response(outcome, cfg.model.model_id)
            try:
                await self._output_step(outcome)
            except TripwireAbort as abort:
                self.steps.append(self._step_record(step_number, outcome, tripwire=abort))
                if abort.retry and self._may_retry_step():
                    self._retry_with_feedback(abort.reason)
                    continue
                self.ml.add(self._assistant_message(outcome.text, []), msgs.RESPONSE)
                raise
            assistant = self._assistant_message(outcome.text, outcome.tool_calls)
            self.ml.add(assistant, msgs.RESPONSE)
            step_record = self._step_record(step_number, outcome)
            if outcome.tool_calls:
                step_record["toolResults"] = await self._run_tools(assistant, outcome.tool_calls, step_number)
            self.steps.append(step_record)
            self.scope.retry_count = 0
            step_number += 1
            if not outcome.tool_calls or step_number >= self.max_steps:
                return outcome.finish_reason

    def _add_usage(self, usage: dict[str, int]) -> None:
        for key in self.usage:
            self.usage[key] += int(usage.get(key) or 0)

    @staticmethod
    def _assistant_message(text: str, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        if text:
            parts.append({"type": "text", "text": text})
        for call in tool_calls:
            parts.append(
                {
                    "type": "tool-invocation",
                    "toolInvocation": {
                        "state": "call",
                        "toolCallId": call["toolCallId"],
                        "toolName": call["toolName"],
                        "args": call.get("args"),
                    },
                }
            )
        return {
            "id": msgs.new_id(),
            "role": "assistant",
            "createdAt": msgs.now_iso(),
            "content": {"format": 2, "parts": parts},
        }

    @staticmethod
    def _step_record(
        step_number: int, outcome: _StepOutcome, tripwire: TripwireAbort | None = None
    ) -> dict[str, Any]:
        return {
            "stepNumber": step_number,
            "text": outcome.text,
            "toolCalls": outcome.tool_calls,
            "toolResults": [],
            "finishReason": outcome.finish_reason,
            "usage": outcome.usage,
            "tripwire": tripwire.as_dict() if tripwire else None,
        }

    # -- per-step hooks -----------------------------------------------------------

    async def _input_step(self, cfg: _StepConfig) -> None:
        for handle in self.lanes.input:
            if not handle.has("process_input_step"):
                continue
            before = self.ml.view()
            req = ppb.ProcessInputStepRequest(model=cfg.model.model_id)
            self._fill(req.messages, before)
            self._fill(req.system_messages, self.system)
            for tool in cfg.tools:
                t = req.tools.add(name=tool["name"], description=tool.get("description", ""))
                t.input_schema.CopyFrom(convert.to_struct(tool.get("inputSchema")))
            if isinstance(cfg.tool_choice, dict):
                req.tool_choice.mode = "tool"
                req.tool_choice.tool_name = cfg.tool_choice.get("toolName", "")
            elif cfg.tool_choice:
                req.tool_choice.mode = cfg.tool_choice
            req.active_tools.extend(cfg.active_tools or [])
            req.provider_options.CopyFrom(convert.to_struct(cfg.provider_options))
            req.model_settings.CopyFrom(convert.to_struct(cfg.model_settings))
            self._steps_proto(req.steps)
            answer = await self.caller.call(handle, "process_input_step", req)
            if answer is None:
                continue
            resp, effects = answer
            if effects.abort is None:
                self._apply_step_overrides(resp, cfg, before, handle)
            await self._apply(effects)

    def _apply_step_overrides(
        self,
        resp: ppb.ProcessInputStepResponse,
        cfg: _StepConfig,
        before: list[dict[str, Any]],
        handle: RunLaneItem,
    ) -> None:
        if resp.replace_messages:
            self.system.extend(self.ml.apply(before, self._returned(resp.messages), msgs.INPUT))
        if resp.replace_system_messages:
            self.system = self._returned(resp.system_messages)
        if resp.HasField("model"):
            model = self.agent.models.get(resp.model)
            if model is None:  # a malformed response: the processor's failure policy decides
                self.caller.fail(
                    handle.branches[handle.pick] if isinstance(handle, ParallelGroup) else handle,
                    "process_input_step",
                    f"returned unknown model {resp.model!r} (configured: {sorted(self.agent.models)}, "
                    "or provider/model-id)",
                )
            else:
                cfg.model = model
        if resp.replace_tools:
            # tools the agent does not have are run by the processor that added them, if it can
            if handle.has("execute_tool"):
                for t in resp.tools:
                    if t.name not in self.agent.tools:
                        self.tool_owners[t.name] = handle
            cfg.tools = [
                {
                    "name": t.name,
                    "description": t.description,
                    "inputSchema": convert.from_struct(t.input_schema),
                }
                for t in resp.tools
            ]
        if resp.tool_choice.mode:
            cfg.tool_choice = (
                {"type": "tool", "toolName": resp.tool_choice.tool_name}
                if resp.tool_choice.mode == "tool"
                else resp.tool_choice.mode
            )
        if resp.replace_active_tools:
            cfg.active_tools = list(resp.active_tools)
        if resp.provider_options.fields:
            cfg.provider_options = convert.from_struct(resp.provider_options)
        if resp.model_settings.fields:
            cfg.model_settings = convert.from_struct(resp.model_settings)

    def _llm_request_handles(self) -> list[RunLaneItem]:
        """Input-lane processors, then error-lane ones that implement processLLMRequest (once each)."""
        return [h for h in _dedupe([*self.lanes.input, *self.lanes.error]) if h.has("process_llm_request")]

    async def _llm_request(
        self, prompt: list[dict[str, Any]], cfg: _StepConfig
    ) -> tuple[list[dict[str, Any]], list[Chunk] | None]:
        cached: list[Chunk] | None = None
        for handle in self._llm_request_handles():
            req = ppb.ProcessLLMRequestRequest(model=cfg.model.model_id)
            convert.prompt_to_proto(prompt, req.prompt)
            self._steps_proto(req.steps)
            answer = await self.caller.call(handle, "process_llm_request", req)
            if answer is None:
                continue
            resp, effects = answer
            if effects.abort is None:
                if resp.replace_prompt:
                    prompt = convert.prompt_from_proto(resp.prompt)
                if resp.has_cached_response and cached is None:  # the first cached response wins
                    cached = [convert.chunk_from_proto(c) for c in resp.cached_response]
            await self._apply(effects)
        return prompt, cached

    async def _model_step(
        self, prompt: list[dict[str, Any]], cfg: _StepConfig, cached: list[Chunk] | None
    ) -> _StepOutcome:
        outcome = _StepOutcome(from_cache=cached is not None)
        tools = cfg.tools
        if cfg.active_tools is not None:
            tools = [t for t in tools if t["name"] in cfg.active_tools]
        request = ModelRequest(
            prompt=prompt,
            tools=tools,
            tool_choice=cfg.tool_choice if tools else None,
            streaming=self.streaming,
            provider_options=cfg.provider_options,
            model_settings=cfg.model_settings,
        )
        self.emit({"type": "step-start", "payload": {"stepNumber": self.scope.step_number}})

        async def source() -> AsyncIterator[Chunk]:
            if cached is not None:
                chunks: AsyncIterator[Chunk] = _replay(cached)
            else:
                self.model_requests.append(request)
                chunks = cfg.model.stream(request)
            started = time.perf_counter()
            try:
                async for chunk in chunks:
                    outcome.raw_chunks.append(chunk)
                    if chunk["type"] == "finish":
                        payload = chunk.get("payload") or {}
                        outcome.finish_reason = payload.get("finishReason", "stop")
                        outcome.usage = payload.get("usage") or {}
                        continue
                    yield chunk
            except APICallError:
                self.metrics.model_calls.labels(cfg.model.model_id, "error").inc()
                raise
            # The step's end goes through the stream hooks too, so a processor holding parts back
            # (batching, carry-over) can let them go before the step is over.
            yield {
                "type": "step-finish",
                "payload": {"finishReason": outcome.finish_reason, "usage": outcome.usage},
            }
            if cached is None:
                self.metrics.model_call_duration.labels(cfg.model.model_id).observe(
                    time.perf_counter() - started
                )
                self.metrics.model_calls.labels(cfg.model.model_id, "ok").inc()
                for direction, key in (("input", "inputTokens"), ("output", "outputTokens")):
                    self.metrics.model_tokens.labels(cfg.model.model_id, direction).inc(
                        int(outcome.usage.get(key) or 0)
                    )

        async def sink(chunk: Chunk) -> None:
            kind = chunk["type"]
            if kind == "text-delta":
                outcome.text += chunk["payload"].get("text", "")
            elif kind == "tool-call":
                outcome.tool_calls.append(chunk["payload"])
            self.emit(chunk)

        outcome.abort = await self.pipeline.run(source(), sink)
        return outcome

    async def _llm_response(self, outcome: _StepOutcome, model_id: str) -> None:
        for handle in self.lanes.input:
            if not handle.has("process_llm_response"):
                continue
            req = ppb.ProcessLLMResponseRequest(model=model_id, from_cache=outcome.from_cache)
            for chunk in outcome.raw_chunks:
                convert.chunk_to_proto(chunk, req.chunks.add())
            self._steps_proto(req.steps)
            answer = await self.caller.call(handle, "process_llm_response", req)
            if answer is not None:
                await self._apply(answer[1])

    async def _output_step(self, outcome: _StepOutcome) -> None:
        for handle in self.lanes.output:
            if not handle.has("process_output_step"):
                continue
            before = self.ml.view()
            req = ppb.ProcessOutputStepRequest(text=outcome.text, finish_reason=outcome.finish_reason)
            self._fill(req.messages, before)
            self._fill(req.system_messages, self.system)
            for call in outcome.tool_calls:
                tc = req.tool_calls.add(tool_call_id=call["toolCallId"], tool_name=call["toolName"])
                tc.args.CopyFrom(convert.to_value(call.get("args")))
            convert.usage_to_proto(outcome.usage, req.usage)
            self._steps_proto(req.steps)
            answer = await self.caller.call(handle, "process_output_step", req)
            if answer is None:
                continue
            resp, effects = answer
            if effects.abort is None and resp.replace_messages:
                self.system.extend(self.ml.apply(before, self._returned(resp.messages), msgs.RESPONSE))
            await self._apply(effects)

    def error_retry_cap(self) -> int | None:
        """maxProcessorRetries when set; else 3 whenever the resolved error list is non-empty."""
        if self.max_retries is not None:
            return self.max_retries
        if not self.lanes.error:
            return None
        if not self.agent.warned_implicit_cap:
            self.agent.warned_implicit_cap = True
            log.warning(
                "agent %s: maxProcessorRetries is not set; error processors may retry at most %d "
                "times per step (set maxProcessorRetries to choose)",
                self.agent.id,
                DEFAULT_ERROR_RETRY_CAP,
            )
        return DEFAULT_ERROR_RETRY_CAP

    async def _api_error(self, err: APICallError) -> bool:
        """Run processAPIError (every lane, once each, until one asks for a retry); True to retry."""
        handles = [
            h
            for h in _dedupe([*self.lanes.input, *self.lanes.output, *self.lanes.error])
            if h.has("process_api_error")
        ]
        for handle in handles:
            before = self.ml.view()
            req = ppb.ProcessAPIErrorRequest()
            req.error.status = err.status
            req.error.message = err.message
            req.error.body = err.body
            req.error.retryable = err.retryable
            req.error.id = err.error_id
            req.error.details.CopyFrom(convert.to_struct(err.details))
            self._fill(req.messages, before)
            self._steps_proto(req.steps)
            answer = await self.caller.call(handle, "process_api_error", req)
            if answer is None:
                continue
            resp, effects = answer
            if effects.abort is None and resp.replace_messages:
                self.system.extend(self.ml.apply(before, self._returned(resp.messages), msgs.INPUT))
            await self._apply(effects)
            if resp.retry:
                cap = self.error_retry_cap()
                if cap is None or self.scope.retry_count >= cap:
                    self.metrics.retry_budget_exhausted.labels("api_error").inc()
                    return False
                self.scope.retry_count += 1
                self.metrics.retries.labels("api_error").inc()
                return True
        return False

    async def _run_tools(
        self, assistant: dict[str, Any], calls: list[dict[str, Any]], step_number: int
    ) -> list[dict[str, Any]]:
        """Execute tool calls; each result goes through processToolResult, then out as a chunk."""
        results: list[dict[str, Any]] = []
        invocations = {
            p["toolInvocation"]["toolCallId"]: p["toolInvocation"]
            for p in assistant["content"]["parts"]
            if p["type"] == "tool-invocation"
        }

        async def source() -> AsyncIterator[Chunk]:
            for call in calls:
                name, call_id, args = call["toolName"], call["toolCallId"], call.get("args")
                tool = self.agent.tools.get(name)
                owner = self.tool_owners.get(name) if tool is None else None
                executed = None if owner is None else await self._execute_tool(owner, name, call_id, args)
                if tool is None and executed is None:
                    message = f"tool {name!r} is not available to agent {self.agent.id!r}"
                    invocations[call_id].update(state="output-error", errorText=message)
                    yield {
                        "type": "tool-error",
                        "payload": {"toolCallId": call_id, "toolName": name, "args": args, "error": message},
                    }
                    continue
                if tool is not None:
                    pending: list[Chunk] = []

                    async def writer(chunk: Chunk, pending: list[Chunk] = pending) -> None:
                        if not str(chunk.get("type", "")).startswith("data-"):
                            raise ValueError("tool writer chunks must have a data-* type")
                        pending.append(chunk)

                    executed = (await tool.execute(args, writer),)
                    for chunk in pending:
                        yield chunk
                assert executed is not None
                value = await self._tool_result(name, call_id, args, executed[0], step_number + 1)
                invocations[call_id].update(state="result", result=value)
                results.append({"toolCallId": call_id, "toolName": name, "args": args, "result": value})
                yield {
                    "type": "tool-result",
                    "payload": {"toolCallId": call_id, "toolName": name, "args": args, "result": value},
                }

        async def sink(chunk: Chunk) -> None:
            if chunk["type"].startswith("data-") and not self.streaming:
                return
            self.emit(chunk)

        abort = await self.pipeline.run(source(), sink)
        if abort is not None:
            raise self._aborted(abort)
        return results

    async def _execute_tool(
        self, owner: RunLaneItem, name: str, call_id: str, args: Any
    ) -> tuple[Any] | None:
        """Run a tool a processor added, on that processor; None when the call was let through."""
        req = ppb.ExecuteToolRequest(tool_name=name, tool_call_id=call_id)
        req.args.CopyFrom(convert.to_value(args))
        self._fill(req.messages, self.ml.items)
        answer = await self.caller.call(owner, "execute_tool", req)
        if answer is None:
            return None
        resp, effects = answer
        await self._apply(effects)
        return (convert.from_value(resp.result),)

    async def _tool_result(self, name: str, call_id: str, args: Any, value: Any, step_number: int) -> Any:
        for handle in self.lanes.output:
            if not handle.has("process_tool_result"):
                continue
            req = ppb.ProcessToolResultRequest(tool_name=name, tool_call_id=call_id)
            req.args.CopyFrom(convert.to_value(args))
            req.result.CopyFrom(convert.to_value(value))
            self._fill(req.messages, self.ml.items)
            self._steps_proto(req.steps)
            answer = await self._call_at(handle, "process_tool_result", req, step_number)
            if answer is None:
                continue
            resp, effects = answer
            if effects.abort is None and resp.replace_result:
                value = convert.from_value(resp.result)
            await self._apply(effects)
        return value

    async def _call_at(
        self, handle: RunLaneItem, hook: str, req: Any, step_number: int
    ) -> tuple[Any, Effects] | None:
        """A call with the step number and retry count processToolResult is given."""
        saved = self.scope.step_number, self.scope.retry_count
        self.scope.step_number, self.scope.retry_count = step_number, 0
        try:
            return await self.caller.call(handle, hook, req)
        finally:
            self.scope.step_number, self.scope.retry_count = saved

    # -- finalization -------------------------------------------------------------

    async def _finalize(self, text: str, finish_reason: str) -> tuple[str, TripwireAbort | None]:
        """processOutputResult once per request, output lane in order; an abort blanks the text."""
        for handle in self.lanes.output:
            if not handle.has("process_output_result"):
                continue
            before = self.ml.view(msgs.RESPONSE)
            req = ppb.ProcessOutputResultRequest()
            self._fill(req.messages, before)
            req.result.text = text
            req.result.finish_reason = finish_reason
            convert.usage_to_proto(self.usage, req.result.usage)
            self._steps_proto(req.result.steps)
            answer = await self.caller.call(handle, "process_output_result", req)
            if answer is None:
                continue
            resp, effects = answer
            if effects.abort is None and resp.replace_messages:
                self.ml.apply(before, self._returned(resp.messages), msgs.RESPONSE)
                text = self._text()
            try:
                await self._apply(effects)
            except TripwireAbort as abort:
                return "", abort
        return text, None


async def _replay(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


_STREAM_END = object()


class RunStream:
    """A streamed run: iterate for chunks, then `await result()` (or await it directly)."""

    def __init__(self, run: _Run) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._run = run
        run._emit = self._queue.put_nowait
        self._task = asyncio.create_task(self._drive())
        self._result: RunResult | None = None

    async def _drive(self) -> RunResult:
        try:
            result, _ = await self._run.execute()
            return result
        finally:
            self._queue.put_nowait(_STREAM_END)

    def __aiter__(self) -> AsyncIterator[Chunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[Chunk]:
        while True:
            item = await self._queue.get()
            if item is _STREAM_END:
                return
            yield item

    async def result(self) -> RunResult:
        """The run's result (consumes any chunks not yet read)."""
        return await self._task

    async def cancel(self) -> None:
        """Stop the run."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, OrchestratorError):
            await self._task


class Agent:
    """An agent bound to its processors: `generate()` and `stream()` as in the seeds."""

    def __init__(self, spec: AgentSpec, metrics: OrchestratorMetrics | None = None) -> None:
        self.spec = spec
        self.metrics = metrics or OrchestratorMetrics()

    def _run(
        self, input: str | list[dict[str, Any]], options: CallOptions | None, *, streaming: bool
    ) -> _Run:
        return _Run(
            self.spec, input, options or CallOptions(), streaming=streaming, emit=None, metrics=self.metrics
        )

    async def generate(
        self, input: str | list[dict[str, Any]], options: CallOptions | None = None
    ) -> RunResult:
        """Run to completion. Raises `APICallError` or `ProcessorFailedError` when the run fails."""
        result, failure = await self._run(input, options, streaming=False).execute()
        if failure is not None:
            if isinstance(failure, OrchestratorError):
                failure.result = result  # what the run did before it failed (run id, steps, usage)
            raise failure
        return result

    def stream(self, input: str | list[dict[str, Any]], options: CallOptions | None = None) -> RunStream:
        """Start a streamed run; failures end the stream with an ``error`` chunk."""
        return RunStream(self._run(input, options, streaming=True))
