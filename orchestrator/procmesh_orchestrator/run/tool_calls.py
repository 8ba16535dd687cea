"""A step's tool calls: the agent's tools or the processor that added one, then processToolResult."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from procmesh_orchestrator.run.base import RunCore
from procmesh_orchestrator.run.hooks import Chunk, ExecuteToolArgs, Processor, ToolResultArgs


async def run_tools(
    run: RunCore,
    assistant: dict[str, Any],
    calls: list[dict[str, Any]],
    step_number: int,
    recorded: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Execute tool calls; each result goes through processToolResult, then out as a chunk.

    `recorded` are the results a cached step's calls had when it was recorded (processLLMRequest
    replayed it): such a call is replayed with its result, as processToolResult left it then,
    and neither the tool nor processToolResult runs again: a side effect would repeat, a
    transform would apply twice. A call without a recorded result runs as usual.
    """
    results: list[dict[str, Any]] = []
    invocations = {
        p["toolInvocation"]["toolCallId"]: p["toolInvocation"]
        for p in assistant["content"]["parts"]
        if p["type"] == "tool-invocation"
    }
    replayed = {(r.get("toolCallId"), r.get("toolName")): r.get("result") for r in recorded}

    def settle(call_id: str, name: str, args: Any, value: Any) -> Chunk:
        """A call's final result: into its invocation and the step's results, out as a chunk."""
        invocations[call_id].update(state="result", result=value)
        payload = {"toolCallId": call_id, "toolName": name, "args": args, "result": value}
        results.append(payload)
        return {"type": "tool-result", "payload": dict(payload)}

    async def source() -> AsyncIterator[Chunk]:
        for call in calls:
            name, call_id, args = call["toolName"], call["toolCallId"], call.get("args")
            if (call_id, name) in replayed:
                yield settle(call_id, name, args, replayed[call_id, name])
                continue
            tool = run.agent.tools.get(name)
            owner = run.tool_owners.get(name) if tool is None else None
            executed = None if owner is None else await _execute_tool(run, owner, name, call_id, args)
            if tool is None and executed is None:
                message = f"tool {name!r} is not available to agent {run.agent.id!r}"
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
            value = await _tool_result(run, name, call_id, args, executed[0], step_number + 1)
            yield settle(call_id, name, args, value)

    def sink(chunk: Chunk) -> None:
        if chunk["type"].startswith("data-") and not run.streaming:
            return
        run.emit(chunk)

    abort = await run.through_output(source(), sink)
    if abort is not None:
        raise run.aborted(abort)
    return results


async def _execute_tool(
    run: RunCore, owner: Processor, name: str, call_id: str, args: Any
) -> tuple[Any] | None:
    """Run a tool a processor added, on that processor; None when the call was let through."""
    answer = await run.call(owner, ExecuteToolArgs(name, call_id, args, run.ml.view()))
    if answer is None:
        return None
    result, effects = answer
    await run.apply(effects)
    return (result.result,)


async def _tool_result(run: RunCore, name: str, call_id: str, args: Any, value: Any, step_number: int) -> Any:
    for item in run.output_lane:
        if not item.has("process_tool_result"):
            continue
        answer = await run.call_at(
            item, ToolResultArgs(name, call_id, args, value, run.ml.view(), run.steps), step_number
        )
        if answer is None:
            continue
        result, effects = answer
        if effects.abort is None and result.replaced:
            value = result.result
        await run.apply(effects)
    return value
