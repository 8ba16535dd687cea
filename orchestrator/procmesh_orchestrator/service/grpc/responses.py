"""The gRPC API's responses: results, the calls a suspended run awaits and durable run records in
their proto shapes, with the same fields the HTTP API's JSON has (`api.results`)."""

from __future__ import annotations

from typing import Any

from procmesh import convert
from procmesh.v1 import agent_pb2 as apb
from procmesh_orchestrator.run import RunResult
from procmesh_orchestrator.service.api.results import all_calls, all_results, model_warnings
from procmesh_orchestrator.store import Decision, DurableRun


def result_to_proto(result: RunResult, warnings: list[dict[str, Any]] | None = None) -> apb.GenerateResponse:
    """A run result as a GenerateResponse; its ``warnings`` are the HTTP result's: `warnings` (the
    call's own, `calls.AgentCall.warnings`), then its model calls' (`model_warnings`)."""
    out = apb.GenerateResponse(
        run_id=result.run_id,
        text=result.text,
        finish_reason=result.finish_reason,
        error=result.error or "",
        status=result.status,
        model_id=result.model_id or "",  # the model that answered (a fallback, when one did)
    )
    suspended_to_proto(result, out.suspended)
    for step in result.steps:
        convert.step_to_proto(step, out.steps.add())
    convert.usage_to_proto(result.usage, out.usage)
    if result.tripwire is not None:
        convert.abort_to_proto(result.tripwire, out.tripwire)
    for message in result.response_messages:
        convert.message_to_proto(message, out.response_messages.add())
    # the reference's result fields, as the HTTP result has them (`result_json`)
    calls_to_proto(all_calls(result), out.tool_calls)
    for res in all_results(result):
        item = out.tool_results.add(
            tool_call_id=str(res.get("toolCallId", "")),
            tool_name=str(res.get("toolName", "")),
            provider_executed=bool(res.get("providerExecuted", False)),
        )
        item.args.CopyFrom(convert.to_value(res.get("args")))
        item.result.CopyFrom(convert.to_value(res.get("result")))
    convert.usage_to_proto(result.usage, out.total_usage)
    out.trace_id = result.trace_id or ""
    if result.object is not None:
        out.object.CopyFrom(convert.to_value(result.object))
    for violation in result.violations:
        entry = out.violations.add(
            processor_id=str(violation.get("processorId", "")), message=str(violation.get("message", ""))
        )
        if violation.get("detail") is not None:
            entry.detail.CopyFrom(convert.to_value(violation["detail"]))
    warnings_to_proto([*(warnings or []), *model_warnings(result)], out.warnings)
    return out


def warnings_to_proto(warnings: list[dict[str, Any]], out: Any) -> None:
    """Call warnings (``{type, setting, details}``) added to a repeated CallWarning field."""
    for warning in warnings:
        out.add(
            type=str(warning.get("type", "")),
            setting=str(warning.get("setting", "")),
            details=str(warning.get("details", "") or ""),
        )


def calls_to_proto(calls: list[dict[str, Any]], out: Any) -> None:
    """Tool calls (``toolCallId``, ``toolName``, ``args``, and a suspended call's
    ``suspendPayload``) added to a repeated ToolCall field."""
    for call in calls:
        item = out.add(tool_call_id=str(call.get("toolCallId", "")), tool_name=str(call.get("toolName", "")))
        item.args.CopyFrom(convert.to_value(call.get("args")))
        if "suspendPayload" in call:
            item.suspend_payload.CopyFrom(convert.to_value(call["suspendPayload"]))


def suspended_to_proto(result: RunResult, out: Any) -> None:
    """The calls a suspended run awaits a decision on, added to `out`."""
    calls_to_proto(result.suspended, out)


def failed_proto(error: BaseException, warnings: list[dict[str, Any]] | None = None) -> apb.GenerateResponse:
    """A failed run as a GenerateResponse: its partial result, when the error carries one (with
    the call's `warnings` as `result_to_proto` has them)."""
    partial = getattr(error, "result", None)
    if isinstance(partial, RunResult):
        out = result_to_proto(partial, warnings)
    else:
        out = apb.GenerateResponse()
        warnings_to_proto(warnings or [], out.warnings)
    out.finish_reason = "error"
    out.error = str(error)
    out.status = "failed"
    return out


def run_record_to_proto(record: DurableRun) -> apb.RunRecord:
    """A durable run's record as a RunRecord."""
    return apb.RunRecord(
        run_id=record.run_id,
        agent_id=record.agent_id,
        thread_id=record.thread_id,
        resource_id=record.resource_id,
        status=record.status,
        attempts=record.attempts,
        created_at=record.created_at,
        updated_at=record.updated_at,
        error=record.error,
        cancel_requested=record.cancel_requested,
    )


def decision_to_proto(d: Decision) -> apb.RunDecision:
    """A decision of a run's record as a RunDecision."""
    return apb.RunDecision(
        agent_id=d.agent_id,
        processor=d.processor,
        sidecar=d.sidecar,
        entry=d.entry,
        hook=d.hook,
        step=d.step,
        part=d.part,
        outcome=d.outcome,
        would=d.would,
        latency_ms=d.latency_ms,
        seen=d.seen,
        content=d.content,
        at=d.at,
    )
