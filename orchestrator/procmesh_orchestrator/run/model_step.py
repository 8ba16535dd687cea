"""A step's model part: the model call (or a cached response replayed) streamed through the output
processors into a `StepOutcome`, timed and traced, and what the outcome leaves in the run (the
assistant message, the step record). `loop` runs the hook steps around it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from procmesh import tracing
from procmesh_orchestrator.errors import APICallError, TripwireAbort
from procmesh_orchestrator.run import messages as msgs
from procmesh_orchestrator.run import optimistic
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import Chunk
from procmesh_orchestrator.run.models import ModelRequest
from procmesh_orchestrator.run.steps import StepConfig, StepOutcome


async def model_step(
    run: RunCore,
    request: ModelRequest,
    cfg: StepConfig,
    cached: list[Chunk] | None,
    early: optimistic.EarlyCall | None,
) -> StepOutcome:
    """One model call (or a cached response replayed), streamed through the output processors.

    `early` is step 0's call when it started before the input processors committed (it is
    replayed when `request` is still the one it sent, else cancelled)."""
    outcome = StepOutcome(from_cache=cached is not None)
    run.emit({"type": "step-start", "payload": {"stepNumber": run.info.step_number}})
    model_id = cfg.model.model_id
    metrics = run.metrics
    # The model's chunks as they came are kept only for what reads them (`StepOutcome.raw_chunks`):
    # a dict or two per delta, alive to the step's end, is most of a long stream's own memory.
    keep_raw = run.info.decisions is not None or any(i.has("process_llm_response") for i in run.input_lane)

    async def source() -> AsyncIterator[Chunk]:
        if cached is not None:
            if early is not None:
                await early.cancel()
            chunks: AsyncIterator[Chunk] = _replay(cached)
        else:
            run.model_requests.append(request)
            chunks = optimistic.stream(early, cfg.model, request)
        started = time.perf_counter()
        # Not a current span: the pipeline resumes this generator from its own tasks.
        span = tracing.start(
            f"chat {model_id}",
            kind="client",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": model_id,
                "procmesh.cached": cached is not None,
            },
        )
        error: BaseException | None = None
        try:
            async for chunk in chunks:
                if keep_raw:
                    outcome.raw_chunks.append(chunk)
                if chunk["type"] == "finish":
                    payload = chunk.get("payload") or {}
                    outcome.finish_reason = payload.get("finishReason", "stop")
                    outcome.usage = payload.get("usage") or {}
                    continue
                yield chunk
        except APICallError as exc:
            error = exc
            metrics.model_calls.labels(model_id, "error").inc()
            raise
        finally:
            span.set("gen_ai.response.finish_reasons", [outcome.finish_reason])
            span.set("gen_ai.usage.input_tokens", outcome.usage.get("inputTokens"))
            span.set("gen_ai.usage.output_tokens", outcome.usage.get("outputTokens"))
            span.end(error)
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

    run.partial_text = ""

    def sink(chunk: Chunk) -> None:
        kind = chunk["type"]
        if kind == "text-delta":
            outcome.text += chunk["payload"].get("text", "")
            run.partial_text = outcome.text
        elif kind == "tool-call":
            outcome.tool_calls.append(chunk["payload"])
        elif kind == "source":
            outcome.sources.append(chunk.get("payload") or {})
        elif kind in ("reasoning-delta", "reasoning-end"):
            payload = chunk.get("payload") or {}
            block = outcome.reasoning.setdefault(str(payload.get("id", "")), {"text": ""})
            block["text"] += payload.get("text", "") if kind == "reasoning-delta" else ""
            if payload.get("providerMetadata"):
                block["providerMetadata"] = payload["providerMetadata"]
        run.emit(chunk)

    outcome.abort = await run.through_output(source(), sink)
    return outcome


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
        "reasoning": [{"id": rid, **block} for rid, block in outcome.reasoning.items() if block["text"]],
        "reasoningText": "".join(r["text"] for r in outcome.reasoning.values()) or None,
        "sources": outcome.sources,
    }


async def _replay(chunks: list[Chunk]) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk
