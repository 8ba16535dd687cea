"""A step's model part: the model call (or a cached response replayed) streamed through the output
processors into a `StepOutcome`, timed and traced, and what the outcome leaves in the run (the
assistant message, the step record). `loop` runs the hook steps around it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from procmesh import tracing
from procmesh_orchestrator.errors import APICallError, TripwireAbort
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run import optimistic
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import Chunk, RehearsedStream
from procmesh_orchestrator.run.models import ModelRequest, setting_warnings
from procmesh_orchestrator.run.steps import StepConfig, StepOutcome
from procmesh_orchestrator.run.text_pieces import Pieces


async def model_step(
    run: RunCore,
    request: ModelRequest,
    cfg: StepConfig,
    cached: list[Chunk] | None,
    early: optimistic.EarlyCall | None,
) -> StepOutcome:
    """One model call (or a cached response replayed), streamed through the output processors.

    `early` is step 0's call when it started before the input processors committed (it is
    replayed when `request` is still the one it sent, else cancelled); its output, rehearsed
    meanwhile, is adopted when it stands (`optimistic.adopted`)."""
    outcome = StepOutcome(from_cache=cached is not None)
    start: Chunk = {"type": "step-start", "payload": {"stepNumber": run.info.step_number}}
    if cached is None:  # a replayed response called no model
        outcome.warnings = setting_warnings(cfg.model, request.model_settings)
    if outcome.warnings:  # as the reference's step start, which carries the call's warnings
        start["payload"]["warnings"] = outcome.warnings
    run.emit(start)
    # The model's chunks as they came are kept only for what reads them (`StepOutcome.raw_chunks`):
    # a dict or two per delta, alive to the step's end, is most of a long stream's own memory.
    keep_raw = run.info.decisions is not None or any(i.has("process_llm_response") for i in run.input_lane)
    held = await optimistic.adopted(early, cfg.model, request) if cached is None else None

    async def source() -> AsyncIterator[Chunk]:
        if cached is not None:
            if early is not None:
                await early.cancel()
        else:
            run.model_requests.append(request)
        call = _ModelCall(run, cfg.model.model_id, outcome, keep_raw, cached=cached is not None)
        error: BaseException | None = None
        try:
            # the model's own stream (`optimistic.stream`), called here so that what it raises
            # at once is the call's failure, as when it raises at its first chunk
            chunks = _replay(cached) if cached is not None else optimistic.stream(early, cfg.model, request)
            async for chunk in chunks:
                if call.took(chunk):
                    yield chunk
        except APICallError as exc:
            error = call.failed(exc)
            raise
        finally:
            call.end(error)
        # The step's end goes through the stream hooks too, so a processor holding parts back
        # (batching, carry-over) can let them go before the step is over.
        yield outcome.step_finish()
        call.counted()

    run.current_step = outcome

    def sink(chunk: Chunk) -> None:
        kind = chunk["type"]
        if kind == "text-delta":
            outcome.texts.add(chunk["payload"].get("text", ""))
        elif kind == "tool-call":
            outcome.tool_calls.append(chunk["payload"])
        elif kind == "source":
            outcome.sources.append(chunk.get("payload") or {})
        elif kind in ("reasoning-delta", "reasoning-end"):
            payload = chunk.get("payload") or {}
            block = outcome.reasoning.setdefault(str(payload.get("id", "")), {"text": Pieces()})
            if kind == "reasoning-delta":
                block["text"].add(payload.get("text", ""))
            if payload.get("providerMetadata"):
                block["providerMetadata"] = payload["providerMetadata"]
        run.emit(chunk)

    if held is not None and early is not None:
        outcome.abort = await _adopt(
            run, request, early, held, _ModelCall(run, cfg.model.model_id, outcome, keep_raw), sink
        )
    else:
        outcome.abort = await run.through_output(source(), sink)
    return outcome


async def _adopt(
    run: RunCore,
    request: ModelRequest,
    early: optimistic.EarlyCall,
    held: RehearsedStream,
    call: _ModelCall,
    sink: Callable[[Chunk], None],
) -> TripwireAbort | None:
    """Step 0's output as rehearsed on the early call (which is this step's call): what it held,
    then the rest as it comes; the call's record (span, finish, usage, metrics) from its chunks."""
    run.model_requests.append(request)
    error: BaseException | None = None
    try:
        abort = await run.take_output(held.adopt(), sink)
    except APICallError as exc:  # the early call's failure, where the stream met it
        error = call.failed(exc)
        raise
    finally:
        complete = early.done and early.error is None  # else an abort or a failure cut it short
        await early.stop()
        for chunk in early.chunks:
            call.took(chunk)
        call.end(error)
    if complete:
        call.counted()
    return abort


class _ModelCall:
    """A step's model call as the run records it: its span, its finish and usage (`StepOutcome`),
    its raw chunks when kept, and its metrics."""

    def __init__(
        self, run: RunCore, model_id: str, outcome: StepOutcome, keep_raw: bool, *, cached: bool = False
    ) -> None:
        self.metrics = run.metrics
        self.model_id = model_id
        self.outcome = outcome
        self.keep_raw = keep_raw
        self.cached = cached
        self.started = time.perf_counter()
        # Not a current span: the pipeline resumes the stream from its own tasks.
        self.span = tracing.start(
            f"chat {model_id}",
            kind="client",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": model_id,
                "procmesh.cached": cached,
            },
        )

    def took(self, chunk: Chunk) -> bool:
        """Record a chunk of the model's; whether the output stream gets it (a finish it does not)."""
        if self.keep_raw:
            self.outcome.raw_chunks.append(chunk)
        return not self.outcome.finished(chunk)

    def failed(self, exc: APICallError) -> APICallError:
        self.metrics.model_calls.labels(self.model_id, "error").inc()
        return exc

    def end(self, error: BaseException | None) -> None:
        outcome, span = self.outcome, self.span
        span.set("gen_ai.response.finish_reasons", [outcome.finish_reason])
        span.set("gen_ai.usage.input_tokens", outcome.usage.get("inputTokens"))
        span.set("gen_ai.usage.output_tokens", outcome.usage.get("outputTokens"))
        span.end(error)

    def counted(self) -> None:
        """The call ended well: its duration, outcome and tokens (a cached response counts none)."""
        if self.cached:
            return
        metrics, model_id = self.metrics, self.model_id
        metrics.model_call_duration.labels(model_id).observe(time.perf_counter() - self.started)
        metrics.model_calls.labels(model_id, "ok").inc()
        for direction, key in (("input", "inputTokens"), ("output", "outputTokens")):
            metrics.model_tokens.labels(model_id, direction).inc(int(self.outcome.usage.get(key) or 0))


def assistant_message(
    text: str, tool_calls: list[dict[str, Any]], reasoning: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The step's answer as the run's assistant message: its reasoning, its text, then its tool
    calls."""
    parts: list[dict[str, Any]] = list(reasoning or [])
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


def step_record(
    step_number: int, outcome: StepOutcome, tripwire: TripwireAbort | None = None
) -> dict[str, Any]:
    """The step as `RunResult.steps` lists it (its tool results are added as they settle)."""
    return {
        "stepNumber": step_number,
        "text": outcome.text,
        "toolCalls": outcome.tool_calls,
        "toolResults": [],
        "finishReason": outcome.finish_reason,
        "usage": outcome.usage,
        "tripwire": tripwire.as_dict() if tripwire else None,
        "reasoning": (reasoning := outcome.reasoning_blocks()),
        "reasoningText": "".join(r["text"] for r in reasoning) or None,
        "sources": outcome.sources,
        **({"warnings": outcome.warnings} if outcome.warnings else {}),
    }


async def _replay(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk
