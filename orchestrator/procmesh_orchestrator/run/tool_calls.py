"""A step's tool calls, in order: arguments checked, approval asked, the tool run, processToolResult.

A call that needs approval and has no decision yet ends the step here: the approval chunk goes
out and `run_tools` returns the calls left, which the loop returns as its end (`PendingTools`; the
run suspends and is saved). A resumed run comes back with the decision and goes on from that call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from procmesh import tracing
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import Chunk, Effects, Processor, ToolResultArgs, ToolResultResult
from procmesh_orchestrator.run.speculation import walk
from procmesh_orchestrator.run.tools import ToolCall, ToolOutcome, invalid_args

DECLINED = "Tool call was not approved by the user"
"""What the model is told of a declined call without a reason (the reference's words)."""

APPROVAL_SCHEMA = (
    '{"type":"object","properties":{"approved":{"type":"boolean","description":"Controls if the tool '
    'call is approved or not, should be true when approved and false when declined"},"reason":'
    '{"type":"string","description":"Optional explanation for the decision, surfaced to the model '
    'when the tool call is declined"}},"required":["approved"],"additionalProperties":false}'
)


@dataclass(frozen=True)
class ApprovalDecision:
    """The caller's answer to one tool call awaiting approval: run it, or tell the model it was
    declined (with `reason`, else `DECLINED`)."""

    approved: bool
    reason: str | None = None


@dataclass
class PendingTools:
    """The calls of a step that have not run yet, when the run stopped for an approval."""

    assistant_id: str
    calls: list[dict[str, Any]]
    step_number: int
    step_record: dict[str, Any]


async def run_tools(
    run: RunCore,
    assistant: dict[str, Any],
    calls: list[dict[str, Any]],
    step_number: int,
    recorded: Sequence[dict[str, Any]] = (),
    decisions: dict[str, ApprovalDecision] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Execute tool calls; each result goes through processToolResult, then out as a chunk.

    Returns (results, calls left): the calls from the first one awaiting approval on (it got its
    approval chunk), empty when every call ran. A client tool's call stays open for the caller.

    `recorded` are the results a cached step's calls had when it was recorded (processLLMRequest
    replayed it): such a call is replayed with its result, as processToolResult left it then,
    and neither the tool nor processToolResult runs again: a side effect would repeat, a
    transform would apply twice. A call without a recorded result runs as usual.
    """
    decisions = decisions or {}
    results: list[dict[str, Any]] = []
    left: list[dict[str, Any]] = []
    invocations = {
        p["toolInvocation"]["toolCallId"]: p["toolInvocation"]
        for p in assistant["content"]["parts"]
        if p["type"] == "tool-invocation"
    }
    replayed = {(r.get("toolCallId"), r.get("toolName")): r.get("result") for r in recorded}

    def settle(call: ToolCall, value: Any) -> Chunk:
        """A call's final result: into its invocation and the step's results, out as a chunk."""
        invocations[call.call_id].update(state="result", result=value)
        payload = {"toolCallId": call.call_id, "toolName": call.name, "args": call.args, "result": value}
        results.append(payload)
        return {"type": "tool-result", "payload": dict(payload)}

    def failed(call: ToolCall, message: str) -> Chunk:
        """The call failed: the model sees the error as the call's result."""
        invocations[call.call_id].update(state="output-error", errorText=message)
        payload = {"toolCallId": call.call_id, "toolName": call.name, "args": call.args, "error": message}
        return {"type": "tool-error", "payload": payload}

    async def source() -> AsyncIterator[Chunk]:
        for index, raw in enumerate(calls):
            call = ToolCall(raw["toolCallId"], raw["toolName"], raw.get("args"))
            if (call.call_id, call.name) in replayed:
                yield settle(call, replayed[call.call_id, call.name])
                continue
            tool = run.tools.get(call.name)
            if tool is None:
                yield failed(call, f"tool {call.name!r} is not available to agent {run.agent.id!r}")
                continue
            problem = invalid_args(tool, call.args)
            if problem is not None:
                yield failed(call, problem)
                continue
            if run.needs_approval(tool):
                decision = decisions.get(call.call_id)
                if decision is None:
                    left.extend(calls[index:])
                    yield {
                        "type": "tool-call-approval",
                        "payload": {
                            "toolCallId": call.call_id,
                            "toolName": call.name,
                            "args": call.args,
                            "resumeSchema": APPROVAL_SCHEMA,
                        },
                    }
                    return
                if not decision.approved:
                    yield settle(call, decision.reason or DECLINED)
                    continue
            pending: list[Chunk] = []

            async def writer(chunk: Chunk, pending: list[Chunk] = pending) -> None:
                if not str(chunk.get("type", "")).startswith("data-"):
                    raise ValueError("tool writer chunks must have a data-* type")
                pending.append(chunk)

            attributes = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.call_id,
            }
            with tracing.span(f"execute_tool {call.name}", attributes=attributes) as span:
                outcome: ToolOutcome | None = await tool.execute(run, call, writer)
                span.outcome("client" if outcome is None else "error" if outcome.error else "ok")
            for chunk in pending:
                yield chunk
            if outcome is None:  # the client runs it: the call stays open
                run.awaiting_client = True
                continue
            if outcome.error is not None:
                run.metrics.tool_calls.labels(call.name, "error").inc()
                yield failed(call, outcome.error)
                continue
            run.metrics.tool_calls.labels(call.name, "ok").inc()
            value = await _tool_result(run, call, outcome.result, step_number + 1)
            yield settle(call, value)

    def sink(chunk: Chunk) -> None:
        if chunk["type"].startswith("data-") and not run.streaming:
            return
        run.emit(chunk)

    abort = await run.through_output(source(), sink)
    if abort is not None:
        raise run.aborted(abort)
    return results, left


async def _tool_result(run: RunCore, call: ToolCall, value: Any, step_number: int) -> Any:
    def build(item: Processor) -> ToolResultArgs:
        return ToolResultArgs(call.name, call.call_id, call.args, value, run.ml.view(), run.steps)

    async def apply(
        item: Processor, args: ToolResultArgs, result: ToolResultResult, effects: Effects
    ) -> bool:
        nonlocal value
        if effects.abort is None and result.replaced:
            value = result.result
        await run.apply(effects)
        return False

    await walk(run, run.output_lane, "process_tool_result", build, apply, step_number=step_number)
    return value
