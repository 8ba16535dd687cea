"""The agent loop: preparation, model steps with their processor hooks, finalization (SPEC §2)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from procmesh import RUN_ID
from procmesh_orchestrator.errors import (
    APICallError,
    MemoryStoreError,
    ProcessorFailedError,
    RunTimeoutError,
    TripwireAbort,
)
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run import retries, steps
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import Chunk
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.run.steps import StepConfig, StepOutcome
from procmesh_orchestrator.run.tool_calls import run_tools
from procmesh_orchestrator.run.types import RunResult, assistant_metadata

RUN_DEADLINE_GRACE = 0.05


def normalize_input(value: str | list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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


class Run(RunCore):
    """One generate()/stream() call: `execute()` runs it to its result."""

    async def execute(self) -> tuple[RunResult, BaseException | None]:
        """Run to the end; the result, and the failure that ended it (None when it did not fail)."""
        token = RUN_ID.set(self.run_id)  # every log line of the run names it (--log-format json)
        try:
            return await self._execute()
        finally:
            RUN_ID.reset(token)

    async def _execute(self) -> tuple[RunResult, BaseException | None]:
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
        except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
            failure = exc
        except TimeoutError:
            failure = RunTimeoutError(self.options.timeout or 0)
        text = self.text()
        if tripwire is not None:
            finish_reason = "other"
            self.emit({"type": "tripwire", "payload": tripwire.as_dict()})
        else:
            if failure is not None:
                finish_reason = "error"
                self.emit({"type": "error", "payload": {"message": str(failure)}})
            try:
                if not isinstance(failure, RunTimeoutError):  # no budget left for finalization
                    text, tripwire = await steps.output_result(
                        self, text, finish_reason, clean=failure is None
                    )
            except (APICallError, ProcessorFailedError, MemoryStoreError) as exc:
                failure = failure or exc
                finish_reason = "error"
            if tripwire is not None:
                finish_reason = "other"
                self.emit({"type": "tripwire", "payload": tripwire.as_dict()})
            else:
                result_meta = assistant_metadata(self.ml.view(msgs.RESPONSE))
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

    async def _prepare_and_loop(self) -> str:
        systems, convo = normalize_input(self.input)
        if self.agent.instructions:
            self.system.append(msgs.text_message("system", self.agent.instructions))
        self.system.extend(systems)
        for m in convo:
            self.ml.add(m, msgs.INPUT)
        await steps.process_input(self)
        return await self._loop()

    async def _loop(self) -> str:
        loop_system = list(self.system)
        step_number = 0
        while True:
            self.info.step_number = step_number
            self.system = list(loop_system)  # processInputStep system changes last one step
            cfg = StepConfig(
                model=self.agent.model,
                tools=[t.spec() for t in self.agent.tools.values()],
                tool_choice="auto" if self.agent.tools else None,
            )
            try:
                await steps.input_step(self, cfg)
            except TripwireAbort as abort:
                if abort.retry and retries.may_retry_step(self):
                    retries.retry_with_feedback(self, abort.reason)
                    continue
                raise
            prompt = msgs.build_prompt(self.system, self.ml.items)
            prompt, cached = await steps.llm_request(self, prompt, cfg)
            try:
                outcome = await self._model_step(prompt, cfg, cached.chunks if cached else None)
            except APICallError as err:
                self.steps.append(_step_record(step_number, StepOutcome(finish_reason="error")))
                if await retries.api_error(self, err):
                    continue
                raise
            if outcome.abort is not None:
                if outcome.text:
                    self.ml.add(_assistant_message(outcome.text, []), msgs.RESPONSE)
                raise self.aborted(outcome.abort)
            self._add_usage(outcome.usage)
            await steps.llm_response(self, outcome, cfg.model.model_id)
            try:
                await steps.output_step(self, outcome)
            except TripwireAbort as abort:
                self.steps.append(_step_record(step_number, outcome, tripwire=abort))
                if abort.retry and retries.may_retry_step(self):
                    retries.retry_with_feedback(self, abort.reason)
                    continue
                self.ml.add(_assistant_message(outcome.text, []), msgs.RESPONSE)
                raise
            assistant = _assistant_message(outcome.text, outcome.tool_calls)
            self.ml.add(assistant, msgs.RESPONSE)
            step_record = _step_record(step_number, outcome)
            if outcome.tool_calls:
                recorded = cached.tool_results if cached else []
                step_record["toolResults"] = await run_tools(
                    self, assistant, outcome.tool_calls, step_number, recorded
                )
            self.steps.append(step_record)
            self.info.retry_count = 0
            step_number += 1
            if not outcome.tool_calls or step_number >= self.max_steps:
                return outcome.finish_reason

    def _add_usage(self, usage: dict[str, int]) -> None:
        for key in self.usage:
            self.usage[key] += int(usage.get(key) or 0)

    async def _model_step(
        self, prompt: list[dict[str, Any]], cfg: StepConfig, cached: list[Chunk] | None
    ) -> StepOutcome:
        """One model call (or a cached response replayed), streamed through the output processors."""
        outcome = StepOutcome(from_cache=cached is not None)
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
        self.emit({"type": "step-start", "payload": {"stepNumber": self.info.step_number}})
        model_id = cfg.model.model_id
        metrics = self.metrics

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
                metrics.model_calls.labels(model_id, "error").inc()
                raise
            # The step's end goes through the stream hooks too, so a processor holding parts back
            # (batching, carry-over) can let them go before the step is over.
            yield {
                "type": "step-finish",
                "payload": {"finishReason": outcome.finish_reason, "usage": outcome.usage},
            }
            if cached is None:
                metrics.model_call_duration.labels(model_id).observe(time.perf_counter() - started)
                metrics.model_calls.labels(model_id, "ok").inc()
                for direction, key in (("input", "inputTokens"), ("output", "outputTokens")):
                    metrics.model_tokens.labels(model_id, direction).inc(int(outcome.usage.get(key) or 0))

        def sink(chunk: Chunk) -> None:
            kind = chunk["type"]
            if kind == "text-delta":
                outcome.text += chunk["payload"].get("text", "")
            elif kind == "tool-call":
                outcome.tool_calls.append(chunk["payload"])
            self.emit(chunk)

        outcome.abort = await self.through_output(source(), sink)
        return outcome


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


def _step_record(
    step_number: int, outcome: StepOutcome, tripwire: TripwireAbort | None = None
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


async def _replay(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk
