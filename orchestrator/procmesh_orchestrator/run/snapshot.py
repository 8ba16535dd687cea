"""A suspended run as data: what it had done, and the calls left, to go on on any replica.

The snapshot holds the messages with their sources, the step records, usage, violations, every
processor's state, the retry counter, signals (they are messages), the serializable request
context entries (the caller's, from which its lanes were chosen, and apart the values its hooks
set, `run.context`), the call's settings (maxSteps, maxProcessorRetries, stopWhen as data, tool
approval, client tools, per-call processor lists by the names the caller gave) and the suspended
step. Processors are named by their lane key, so a resumed run finds the same ones: the agent's,
or the call's lists bound again by the resuming orchestrator (`AgentSpec.bind_lanes`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.errors import ConfigError, SuspendError
from procmesh_orchestrator.run import context, stop
from procmesh_orchestrator.run.context import serializable
from procmesh_orchestrator.run.framework import prepare_step
from procmesh_orchestrator.run.framework.history_budget import HistoryBudget
from procmesh_orchestrator.run.framework.memory import MemoryCallOptions
from procmesh_orchestrator.run.tool_calls import PendingTools
from procmesh_orchestrator.run.tools import ClientTool, ProcessorTool
from procmesh_orchestrator.run.types import StructuredOutput
from procmesh_orchestrator.store import SuspendedRun

if TYPE_CHECKING:
    from procmesh_orchestrator.run.base import RunCore
    from procmesh_orchestrator.run.types import AgentSpec, CallOptions

log = logging.getLogger(__name__)

VERSION = 1


def _serializable(context: dict[str, Any]) -> dict[str, Any]:
    """The request context entries that survive a snapshot (the seed: functions, connections and
    the like do not; rebuild them at the resume boundary)."""
    kept = serializable(context)
    if len(kept) < len(context):
        left = sorted(set(context) - set(kept))
        log.debug("request context entries %s are not serializable: not kept in the snapshot", left)
    return kept


def capture(run: RunCore, *, pending: PendingTools | None = None, next_step: int = 0) -> dict[str, Any]:
    """The run's state as JSON: suspended at `pending`'s calls, or at the boundary before
    `next_step` (a durable run's checkpoint). SuspendError when something in it is not JSON."""
    lanes = (*run.input_lane, *run.output_lane, *run.error_lane)
    keys = {id(item): item.key for item in lanes}
    data = {
        "version": VERSION,
        "runId": run.run_id,
        "agentId": run.agent.id,
        "threadId": run.info.thread_id,
        "resourceId": run.info.resource_id,
        "requestContext": _serializable(run.options.request_context),
        "hookValues": run.info.hook_values,
        "messages": [{"message": m, "source": src} for m, src in run.ml.dump()],
        "system": run.loop_system,
        "steps": run.steps,
        "usage": run.usage,
        "violations": run.violations,
        "states": run.caller.export_states(),
        "retryCount": run.info.retry_count,
        "maxSteps": run.max_steps,
        "maxProcessorRetries": run.max_retries,
        "stopWhen": stop.dump(run.stop_when),
        "requireToolApproval": run.options.require_tool_approval,
        "clientTools": [
            {
                "name": t.name,
                "description": t.description,
                "inputSchema": t.input_schema,
                "requiresApproval": t.requires_approval,
            }
            for t in run.tools.values()
            if isinstance(t, ClientTool)
        ],
        "processorTools": {
            name: {"key": keys[id(t.host)], "description": t.description, "inputSchema": t.input_schema}
            for name, t in run.tools.items()
            if isinstance(t, ProcessorTool) and id(t.host) in keys and name not in run.agent.tools
        },
        "atCleanEnd": [item.key for item in run.at_clean_end],
        **_step_options(run.options),
        "nextStep": next_step,
        "pending": None
        if pending is None
        else {
            "assistantId": pending.assistant_id,
            "calls": pending.calls,
            "stepNumber": pending.step_number,
            "stepRecord": pending.step_record,
            "suspension": pending.suspension,
        },
    }
    try:
        json.dumps(data)
    except (TypeError, ValueError) as exc:
        raise SuspendError(f"run {run.run_id}: its state cannot be kept in the store: {exc}") from exc
    return data


def suspended_run(run: RunCore, pending: PendingTools) -> SuspendedRun:
    """The store record of `run`, suspended at `pending`."""
    return SuspendedRun(
        run_id=run.run_id,
        agent_id=run.agent.id,
        thread_id=run.info.thread_id,
        resource_id=run.info.resource_id,
        tool_call_ids=(pending.calls[0]["toolCallId"],),
        snapshot=capture(run, pending=pending),
    )


def call_data(options: CallOptions) -> dict[str, Any]:
    """A call's options as JSON, in the snapshot's keys (`resumed_options` reads them back): what a
    durable run keeps before its first checkpoint."""
    return {
        "threadId": options.thread_id,
        "resourceId": options.resource_id,
        "requestContext": _serializable(options.request_context),
        "maxSteps": options.max_steps,
        "maxProcessorRetries": options.max_processor_retries,
        "stopWhen": None if options.stop_when is None else stop.dump(options.stop_when),
        "requireToolApproval": options.require_tool_approval,
        "clientTools": [
            {
                "name": t.name,
                "description": t.description,
                "inputSchema": t.input_schema,
                "requiresApproval": t.requires_approval,
            }
            for t in options.client_tools
        ],
        "callInstructions": options.instructions,
        "callSystem": list(options.system),
        **_step_options(options),
    }


def _step_options(options: CallOptions) -> dict[str, Any]:
    """The call's settings every step applies (a resumed run applies them too)."""
    structured = options.structured_output
    return {
        "processorLists": _processor_lists(options),
        "timeout": options.timeout,
        "modelSettings": None if options.model_settings is None else dict(options.model_settings),
        "toolChoice": options.tool_choice,
        "activeTools": None if options.active_tools is None else list(options.active_tools),
        "prepareSteps": [rule.dump() for rule in options.prepare_steps],
        "memoryOptions": {
            "lastMessages": options.memory.last_messages,
            "readOnly": options.memory.read_only,
            "semanticRecall": options.memory.semantic_recall,
            "messageHistory": _budget(options.memory.message_history),
        },
        "structuredOutput": None
        if structured is None
        else {
            "schema": dict(structured.schema),
            "errorStrategy": structured.error_strategy,
            "fallbackValue": structured.fallback_value,
            "instructions": structured.instructions,
            "model": structured.model,
            "jsonPromptInjection": structured.json_prompt_injection,
        },
    }


def _processor_lists(options: CallOptions) -> dict[str, list[str]]:
    """The call's processor lists by name; SuspendError for a list given bound but unnamed (the
    resumed run could not bind it again, and would run without the guards the caller chose)."""
    given = {
        "input": options.input_processors,
        "output": options.output_processors,
        "error": options.error_processors,
    }
    unnamed = [
        kind for kind, lane in given.items() if lane is not None and kind not in options.processor_names
    ]
    if unnamed:
        raise SuspendError(
            f"the call's {', '.join(unnamed)} processor list is not named (CallOptions.processor_names): "
            "a resumed run could not bind it again"
        )
    return {kind: list(names) for kind, names in options.processor_names.items()}


def resumed_context(data: dict[str, Any], options: CallOptions) -> dict[str, Any]:
    """The request context a resumed run goes on with: the suspended call's, the resuming call's
    keys over it."""
    return {**data["requestContext"], **options.request_context}


def resumed_options(data: dict[str, Any], options: CallOptions, agent: AgentSpec) -> CallOptions:
    """The resuming call's options, with what the suspended call decided (ids, limits, tools, its
    processor lists bound again by `agent`). SuspendError naming a list entry this orchestrator
    cannot bind (a processor its sidecars no longer host, a workflow no longer configured)."""
    names: dict[str, list[str]] = data.get("processorLists") or {}
    lists = _bound_lists(data, names, agent)
    stop_when = options.stop_when
    if stop_when is None and data["stopWhen"] is not None:
        stop_when = stop.parse(data["stopWhen"])
    return replace(
        options,
        thread_id=data["threadId"],
        resource_id=data["resourceId"],
        request_context=resumed_context(data, options),
        max_steps=data["maxSteps"],
        max_processor_retries=data["maxProcessorRetries"],
        timeout=options.timeout if options.timeout is not None else data.get("timeout"),
        model_settings=data.get("modelSettings"),
        tool_choice=data.get("toolChoice"),
        active_tools=data.get("activeTools"),
        prepare_steps=prepare_step.load_rules(data.get("prepareSteps") or ()),
        structured_output=_structured(data.get("structuredOutput")),
        memory=_memory_options(data.get("memoryOptions")),
        # applied where the run starts (a durable run taken over before its first checkpoint);
        # a resumed run's system messages are already in its snapshot
        instructions=data.get("callInstructions"),
        system=tuple(data.get("callSystem") or ()),
        stop_when=stop_when,
        require_tool_approval=data["requireToolApproval"],
        client_tools=[
            ClientTool(t["name"], t["description"], t["inputSchema"], t.get("requiresApproval", False))
            for t in data["clientTools"]
        ],
        input_processors=lists.get("input"),
        output_processors=lists.get("output"),
        error_processors=lists.get("error"),
        processor_names=names,
    )


def _memory_options(data: dict[str, Any] | None) -> MemoryCallOptions:
    """The suspended call's memory options (a snapshot from before they were kept: the agent's)."""
    if not data:
        return MemoryCallOptions()
    budget = data.get("messageHistory")
    return MemoryCallOptions(
        data.get("lastMessages"),
        data.get("readOnly"),
        data.get("semanticRecall"),
        None if budget is None else HistoryBudget(budget["maxTokens"], budget["atMaxRemoveTokens"]),
    )


def _budget(budget: HistoryBudget | None) -> dict[str, float] | None:
    """A call's token budget as the snapshot keeps it (the resumed run's steps apply it)."""
    return None if budget is None else budget.as_json()


def _bound_lists(data: dict[str, Any], names: dict[str, list[str]], agent: AgentSpec) -> dict[str, Any]:
    if not names:
        return {}
    run = f"run {data['runId']}" if data.get("runId") else "the run"
    if agent.bind_lanes is None:
        raise SuspendError(f"{run}: agent {agent.id!r} cannot bind the call's processor lists here")
    try:
        return agent.bind_lanes(names)
    except ConfigError as exc:
        raise SuspendError(f"{run} cannot resume with the call's processor lists: {exc}") from None


def restore(run: RunCore, data: dict[str, Any]) -> PendingTools | None:
    """Put the snapshot's state into a fresh run; the suspended step's calls left (None: the
    snapshot is a step boundary, the run goes on at ``data["nextStep"]``)."""
    if data.get("version") != VERSION:
        version = data.get("version")
        run_id = data.get("runId")
        raise SuspendError(f"run {run_id}: snapshot version {version!r}, this build reads {VERSION}")
    for entry in data["messages"]:
        run.ml.add(entry["message"], entry["source"])
    run.loop_system = list(data["system"])
    run.system = list(data["system"])
    run.steps = list(data["steps"])
    run.usage = dict(data["usage"])
    run.violations = list(data["violations"])
    run.caller.import_states(data["states"])
    run.info.retry_count = int(data["retryCount"])
    context.set_values(run.info, data.get("hookValues") or {})
    by_key = {item.key: item for item in (*run.input_lane, *run.output_lane, *run.error_lane)}
    for name, tool in data["processorTools"].items():
        host = by_key.get(tool["key"])
        if host is not None:
            run.tools[name] = ProcessorTool(name, tool["description"], tool["inputSchema"], host)
    run.at_clean_end = [by_key[key] for key in data["atCleanEnd"] if key in by_key]
    pending = data["pending"]
    if pending is None:
        return None
    return PendingTools(
        pending["assistantId"],
        pending["calls"],
        pending["stepNumber"],
        pending["stepRecord"],
        pending.get("suspension"),  # absent from a snapshot taken before tools could suspend
    )


def _structured(data: dict[str, Any] | None) -> StructuredOutput | None:
    if data is None:
        return None
    return StructuredOutput(
        data["schema"],
        data["errorStrategy"],
        data["fallbackValue"],
        data["instructions"],
        data.get("model"),
        bool(data.get("jsonPromptInjection")),  # absent from a snapshot written before it existed
    )
