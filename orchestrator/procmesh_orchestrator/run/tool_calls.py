"""A step's tool calls: arguments checked, approval asked, the tools run, processToolResult.

The tools of one step run concurrently, up to the agent's `toolCallConcurrency` (`in_order`);
their chunks, results and processToolResult keep the order the model called them in.

A call that needs approval and has no decision yet ends the step here: the approval chunk goes
out and `run_tools` returns the calls left, which the loop returns as its end (`PendingTools`; the
run suspends and is saved). A resumed run comes back with the decision and goes on from that call.
A tool that suspends itself (the seeds' ``suspend(payload)``) is left the same way, with a
``tool-call-suspended`` chunk at its turn; the calls beside it settle as usual. Resumed with data
(`Resumed`), it runs again and sees the data.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import jsonschema

from procmesh import tracing
from procmesh_orchestrator.errors import ResumeMismatchError
from procmesh_orchestrator.run import background
from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import (
    Chunk,
    Effects,
    Processor,
    Resumed,
    Suspension,
    ToolResultArgs,
    ToolResultResult,
)
from procmesh_orchestrator.run.in_order import InOrder
from procmesh_orchestrator.run.messages import keep_model_output
from procmesh_orchestrator.run.speculation import walk
from procmesh_orchestrator.run.tools import Tool, ToolCall, ToolOutcome, invalid_args

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


Decision = ApprovalDecision | Resumed
"""How the caller answers a suspended call: a decision on its approval, or the data it asked for."""


@dataclass
class PendingTools:
    """The calls of a step that have not run yet, when the run stopped for an approval or a tool
    suspended itself."""

    assistant_id: str
    calls: list[dict[str, Any]]
    step_number: int
    step_record: dict[str, Any]
    suspension: dict[str, Any] | None = None
    """When the first of `calls` suspended itself: ``payload`` and ``resumeSchema`` (None: that
    call awaits approval)."""


def answer_for(pending: PendingTools, decision: Decision, run_id: str) -> Decision:
    """The caller's answer to the first pending call, checked against what the call awaits: data
    for a call that suspended itself (with what it suspended with), an approval for the other;
    resume data ``{approved, reason?}`` is the approval (the reference's rule).
    ResumeMismatchError otherwise (the run stays suspended)."""
    call = pending.calls[0]["toolCallId"]
    if pending.suspension is not None:
        if isinstance(decision, ApprovalDecision):
            raise ResumeMismatchError(
                f"run {run_id}: tool call {call!r} suspended itself and awaits resume data, not an "
                "approval: resume it with resumeData (resume-stream)"
            )
        return replace(decision, suspend_payload=pending.suspension.get("payload"))
    if isinstance(decision, ApprovalDecision):
        return decision
    problems = sorted(jsonschema.Draft202012Validator(_APPROVAL).iter_errors(decision.data), key=str)
    if problems:
        raise ResumeMismatchError(
            f"run {run_id}: tool call {call!r} awaits an approval: resumeData must be "
            f"{{approved: boolean, reason?: string}} ({problems[0].message})"
        )
    return ApprovalDecision(decision.data["approved"], decision.data.get("reason"))


_APPROVAL = json.loads(APPROVAL_SCHEMA)


def _record_output(run: RunCore, step_number: int, call: ToolCall, outcome: ToolOutcome) -> None:
    """The tool's own answer, before processToolResult (an error too), for replay
    (``agents.ID.recordInputs``): a replay gives it to the candidate's processors as the tool did."""
    body: dict[str, Any] = {"toolCallId": call.call_id, "toolName": call.name, "args": call.args}
    if outcome.error is not None:
        body["error"] = outcome.error
    else:
        body["result"] = outcome.result
        if outcome.model_output is not None:
            body["modelOutput"] = outcome.model_output
    run.record_input("tool-output", step_number, body)


async def run_tools(
    run: RunCore,
    assistant: dict[str, Any],
    calls: list[dict[str, Any]],
    step_number: int,
    recorded: Sequence[dict[str, Any]] = (),
    decisions: dict[str, Decision] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
    """Execute tool calls; each result goes through processToolResult, then out as a chunk.

    Returns (results, calls left, suspension): the calls left are those that suspended themselves
    (each got its ``tool-call-suspended`` chunk) then those from the first one awaiting approval
    on (it got its approval chunk), empty when every call ran; the suspension is the first left
    call's (`PendingTools.suspension`). A client tool's call stays open for the caller.

    `recorded` are the results a cached step's calls had when it was recorded (processLLMRequest
    replayed it): such a call is replayed with its result, as processToolResult left it then,
    and neither the tool nor processToolResult runs again: a side effect would repeat, a
    transform would apply twice. A call without a recorded result runs as usual.
    """
    decisions = decisions or {}
    results: list[dict[str, Any]] = []
    left: list[dict[str, Any]] = []
    suspended: list[tuple[dict[str, Any], dict[str, Any]]] = []
    invocations = {
        p["toolInvocation"]["toolCallId"]: p["toolInvocation"]
        for p in assistant["content"]["parts"]
        if p["type"] == "tool-invocation"
    }
    replayed = {(r.get("toolCallId"), r.get("toolName")): r.get("result") for r in recorded}

    def settle(call: ToolCall, value: Any) -> Chunk:
        """A call's final result: into its invocation and the step's results, out as a chunk."""
        invocations[call.call_id].update(state="result", result=value)
        background.settled(run, call.call_id)  # a background call's result may replace it now
        payload = {"toolCallId": call.call_id, "toolName": call.name, "args": call.args, "result": value}
        results.append(payload)
        return {"type": "tool-result", "payload": dict(payload)}

    def failed(call: ToolCall, message: str) -> Chunk:
        """The call failed: the model sees the error as the call's result."""
        invocations[call.call_id].update(state="output-error", errorText=message)
        background.settled(run, call.call_id)
        payload = {"toolCallId": call.call_id, "toolName": call.name, "args": call.args, "error": message}
        return {"type": "tool-error", "payload": payload}

    async def execute(tool: Tool, call: ToolCall) -> tuple[ToolOutcome | None, list[Chunk]]:
        """Run the tool; the data chunks it wrote wait for their turn in the step's order."""
        written: list[Chunk] = []

        async def writer(chunk: Chunk) -> None:
            if not str(chunk.get("type", "")).startswith("data-"):
                raise ValueError("tool writer chunks must have a data-* type")
            written.append(chunk)

        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.call_id,
        }
        with tracing.span(f"execute_tool {call.name}", attributes=attributes) as span:
            outcome = await tool.execute(run, call, writer)
            span.outcome("client" if outcome is None else "error" if outcome.error else "ok")
        return outcome, written

    # Sorted up front, in the model's order, so the tools to run start together (up to the
    # agent's toolCallConcurrency). A call settled without its tool (replayed, unknown, bad
    # arguments, declined) keeps its chunk's maker in `entries`. A call awaiting approval ends the
    # step there: the calls before it still run, the ones from it on wait for the decision.
    executions: InOrder[tuple[ToolOutcome | None, list[Chunk]]] = InOrder(run.agent.tool_call_concurrency)
    entries: list[tuple[ToolCall, Callable[[], Chunk] | None]] = []
    approval: Chunk | None = None
    for index, raw in enumerate(calls):
        call = ToolCall(raw["toolCallId"], raw["toolName"], raw.get("args"))
        tool = run.tools.get(call.name)
        decision = decisions.get(call.call_id)
        problem = None if tool is None else invalid_args(tool, call.args)
        if (call.call_id, call.name) in replayed:
            entries.append((call, partial(settle, call, replayed[call.call_id, call.name])))
        elif tool is None:
            message = f"tool {call.name!r} is not available to agent {run.agent.id!r}"
            entries.append((call, partial(failed, call, message)))
        elif problem is not None:
            entries.append((call, partial(failed, call, problem)))
        elif run.needs_approval(tool) and decision is None:
            left.extend(calls[index:])
            approval = {
                "type": "tool-call-approval",
                "payload": {
                    "toolCallId": call.call_id,
                    "toolName": call.name,
                    "args": call.args,
                    "resumeSchema": APPROVAL_SCHEMA,
                },
            }
            break
        elif isinstance(decision, ApprovalDecision) and not decision.approved and run.needs_approval(tool):
            entries.append((call, partial(settle, call, decision.reason or DECLINED)))
        else:  # a call resumed with data runs again with it (approved, if it needed it, before)
            resumed = decision if isinstance(decision, Resumed) else None
            executions.add(index, partial(execute, tool, replace(call, resumed=resumed)))
            entries.append((call, None))

    async def source() -> AsyncIterator[Chunk]:
        try:
            for index, (call, decided) in enumerate(entries):
                if decided is not None:
                    yield decided()
                    continue
                outcome, written = await executions.result(index)
                if outcome is not None and outcome.effects is not None:
                    await run.apply(outcome.effects)  # as they came, before the written chunks
                for chunk in written:
                    yield chunk
                if outcome is None:  # the client runs it: the call stays open
                    run.awaiting_client = True
                    continue
                if outcome.suspended is not None:  # left for the caller's data, at its turn
                    run.metrics.tool_calls.labels(call.name, "suspended").inc()
                    suspended.append((calls[index], _suspension(outcome.suspended)))
                    yield _suspended_chunk(call, outcome.suspended)
                    continue
                _record_output(run, step_number, call, outcome)
                if outcome.error is not None:
                    run.metrics.tool_calls.labels(call.name, "error").inc()
                    yield failed(call, outcome.error)
                    continue
                run.metrics.tool_calls.labels(call.name, "ok").inc()
                value = await _tool_result(run, call, outcome.result, step_number + 1)
                if outcome.model_output is not None and value is outcome.result:  # not replaced
                    keep_model_output(assistant, call.call_id, outcome.model_output)
                yield settle(call, value)
            if approval is not None:
                yield approval
        finally:  # an abort or a failure ended the step: what still runs is cancelled
            await executions.aclose()

    def sink(chunk: Chunk) -> None:
        if chunk["type"].startswith("data-") and not run.streaming:
            return
        run.emit(chunk)

    abort = await run.through_output(source(), sink)
    if abort is not None:
        raise run.aborted(abort)
    if suspended:
        return results, [raw for raw, _ in suspended] + left, suspended[0][1]
    return results, left, None


def _suspension(suspension: Suspension) -> dict[str, Any]:
    return {"payload": suspension.payload, "resumeSchema": suspension.resume_schema}


def _suspended_chunk(call: ToolCall, suspension: Suspension) -> Chunk:
    """The reference's chunk for a tool's suspend(payload)."""
    payload = {
        "toolCallId": call.call_id,
        "toolName": call.name,
        "suspendPayload": suspension.payload,
        "args": call.args,
    }
    if suspension.resume_schema is not None:
        payload["resumeSchema"] = suspension.resume_schema
    return {"type": "tool-call-suspended", "payload": payload}


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
