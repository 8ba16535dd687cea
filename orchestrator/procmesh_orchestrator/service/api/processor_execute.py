"""``getProcessor(id).execute()``: one phase of a processor the sidecars host, or of a processor
workflow, on the messages the caller gives, through the run's own `GrpcHookCaller`.

A workflow runs as an agent's lane runs it (`LaneBinder.workflow`): nested workflows in their
step's place, error steps catching a failing step, parallel branches and their map, conditions
on the request context decided once and those on the call at each call. Each step gets what
the steps before it made of the messages; a tripwire stops the workflow with its processor's id.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.errors import ConfigError, ProcessorFailedError, RequestContextError, TripwireAbort
from procmesh_orchestrator.processors import GrpcHookCaller, call_lanes
from procmesh_orchestrator.run.hooks import (
    HookArgs,
    InputArgs,
    InputStepArgs,
    OutputResultArgs,
    OutputStepArgs,
    Processor,
    RunInfo,
    ToolResultArgs,
    expand_lane,
)
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.service._errors import BadRequestError
from procmesh_orchestrator.service.api.message_keys import Keys, count_ignored, ignored_labels
from procmesh_orchestrator.service.api.messages import db_message
from procmesh_orchestrator.service.api.processors import find_processor, hosted_processors, workflow_phases
from procmesh_orchestrator.service.api.results import dumps
from procmesh_orchestrator.store import label

if TYPE_CHECKING:
    from procmesh_orchestrator.service.api.core import ServiceCore

BODY_KEYS = ("phase", "messages", "agentId", "requestContext")
"""What the client sends (``Processor.execute``); ``phase`` and ``messages`` are required."""

Outcome = tuple[list[dict[str, Any]], TripwireAbort | None]
"""What executing a phase gave: the messages after it, or those an abort stopped at, and the abort."""

_NO_USAGE = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}


@dataclass(frozen=True)
class _Target:
    """What the id names, bound: one processor, or a workflow's steps as this call takes them."""

    name: str
    """How errors name it: ``processor 'x'`` or ``processor workflow 'x'``."""
    lane: tuple[Processor, ...]
    phases: list[str]
    workflow: bool


def check_body(body: dict[str, Any]) -> None:
    """The body's keys: an unknown one, or a required one missing, is a 400 naming it."""
    if unknown := sorted(set(body) - set(BODY_KEYS)):
        raise BadRequestError(
            f"unknown keys: {', '.join(label(k) for k in unknown)} (the body takes {', '.join(BODY_KEYS)})"
        )
    if missing := [key for key in ("phase", "messages") if body.get(key) is None]:
        raise BadRequestError(f"{', '.join(missing)}: required")


def _target(
    service: ServiceCore, processor_id: str, agent_id: str | None, context: dict[str, Any]
) -> _Target:
    """The processor or processor workflow `processor_id` names, bound: a processor with the options
    `agent_id`'s lanes give it (else none), a workflow's steps with their own, both with the options
    they take from the request context (`context`, the caller's resource under ``resourceId``)."""
    binder = service.app.binder
    try:
        if processor_id in service.app.config.workflows and processor_id not in hosted_processors(service):
            try:
                steps = binder.workflow(processor_id)
            except ConfigError as exc:  # a step its sidecars no longer host (after a reload)
                raise BadRequestError(f"processor workflow {processor_id!r} cannot run: {exc}") from None
            return _Target(
                f"processor workflow {processor_id!r}",
                expand_lane(steps, context),
                workflow_phases(service, processor_id),
                workflow=True,
            )
        hosted = find_processor(service, processor_id)
        lanes = service.agent(agent_id).spec.lanes if agent_id else None
        try:
            handle = call_lanes.handle(binder, hosted, lanes)
        except ConfigError as exc:  # options it requires, which no lane of agentId's gives it
            raise BadRequestError(
                f"processor {hosted.id!r} needs options to run: {exc} (send the agentId of an agent "
                "whose lanes configure it)"
            ) from None
        return _Target(
            f"processor {hosted.id!r}", expand_lane([handle], context), hosted.phases, workflow=False
        )
    except RequestContextError as exc:  # options from the request context that a schema refuses
        raise BadRequestError(str(exc)) from None


async def _run_stream(
    caller: GrpcHookCaller, lane: Sequence[Processor], messages: list[dict[str, Any]]
) -> Outcome:
    """``outputStream``: each text part of the assistant messages as one ``text-delta`` chunk
    (then ``finish``), through the lane's ProcessOutputStream sessions; each part's text becomes
    what came out of them for it."""
    shown = [json.loads(dumps(m)) for m in messages]  # a copy the texts are written into
    parts = {
        f"m{i}.{j}": part
        for i, message in enumerate(shown)
        if message.get("role") == "assistant"
        for j, part in enumerate((message.get("content") or {}).get("parts") or [])
        if part.get("type") == "text"
    }
    if not parts:
        raise BadRequestError("messages: outputStream streams the assistant messages' text: give one")

    async def source() -> AsyncIterator[dict[str, Any]]:
        for key, part in parts.items():
            yield {"type": "text-delta", "payload": {"id": key, "text": part["text"]}}
        yield {"type": "finish", "payload": {"finishReason": "stop", "usage": _NO_USAGE}}

    out = dict.fromkeys(parts, "")
    async with contextlib.aclosing(caller.stream(lane, source(), announce_signals=False)) as items:
        async for item in items:
            if isinstance(item, TripwireAbort):
                return messages, item
            if isinstance(item, dict) and item.get("type") == "text-delta":
                payload = item.get("payload") or {}
                key = str(payload.get("id", ""))
                if key in out:
                    out[key] += str(payload.get("text", ""))
    for key, part in parts.items():
        part["text"] = out[key]
    return shown, None


async def _run_tool_results(
    caller: GrpcHookCaller, lane: Sequence[Processor], messages: list[dict[str, Any]]
) -> Outcome:
    """``toolResult``: ProcessToolResult on each tool result in the messages (a ``tool-invocation``
    part in state ``result``), in order, through the lane in order; a replaced result goes into its
    part and on to the next processor."""
    shown = [json.loads(dumps(m)) for m in messages]  # a copy the results are written into
    found = False
    for message in shown:
        for part in (message.get("content") or {}).get("parts") or []:
            inv = part.get("toolInvocation") if part.get("type") == "tool-invocation" else None
            if not isinstance(inv, dict) or inv.get("state") != "result":
                continue
            found = True
            for item in lane:
                if not item.has("process_tool_result"):
                    continue
                args = ToolResultArgs(
                    str(inv.get("toolName", "")),
                    str(inv.get("toolCallId", "")),
                    inv.get("args"),
                    inv.get("result"),
                    messages,
                    [],
                )
                reply = await caller.call(item, args)
                if reply.effects.abort is not None:
                    return messages, reply.effects.abort
                if reply.result is not None and reply.result.replaced:
                    inv["result"] = reply.result.result
    if not found:
        raise BadRequestError(
            "messages: toolResult runs on tool results: give an assistant message with a "
            "tool-invocation part in state 'result'"
        )
    return shown, None


def _hook_args(phase: str, messages: list[dict[str, Any]], model: str) -> HookArgs[Any]:
    text = message_text(messages[-1]) if messages and messages[-1].get("role") == "assistant" else ""
    if phase == "input":
        return InputArgs(messages, messages, [])
    if phase == "inputStep":
        return InputStepArgs(model, messages, [], [], "auto", None, {}, {}, [])
    if phase == "outputStep":
        return OutputStepArgs(text, "stop", messages, [], [], dict(_NO_USAGE), [])
    return OutputResultArgs(messages, text, "stop", dict(_NO_USAGE), [])


async def _run_messages(
    caller: GrpcHookCaller, target: _Target, phase: str, messages: list[dict[str, Any]], model: str
) -> Outcome | str:
    """A message phase (input, inputStep, outputStep, outputResult) through the lane in order, each
    processor on the messages the ones before it returned. A lone processor failing open is an
    error (str); a workflow's step failing open is skipped, as a run skips it."""
    hook = next(h for h, p in call_lanes.PHASES.items() if p == phase)
    for item in target.lane:
        if not item.has(hook):
            continue
        reply = await caller.call(item, _hook_args(phase, messages, model))
        if reply.effects.abort is not None:
            return messages, reply.effects.abort
        if reply.result is None:
            if not target.workflow:
                return "the processor failed (fail-open)"
            continue
        out = getattr(reply.result, "messages", None)
        messages = messages if out is None else out
    return messages, None


def _messages(service: ServiceCore, raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise BadRequestError("messages: must be a list of messages")
    if len(raw) > service.limits.max_messages:
        raise BadRequestError(f"messages: at most {service.limits.max_messages}")
    ignored: list[tuple[Keys, str]] = []
    messages = [db_message(m, f"messages.{i}", ignored) for i, m in enumerate(raw)]
    count_ignored(service.metrics, "a processor execute's", ignored_labels(ignored))
    return messages


async def execute_phase(
    service: ServiceCore, processor_id: str, body: dict[str, Any], context: dict[str, Any], resource: str
) -> dict[str, Any]:
    """``POST /processors/{id}/execute``: one phase of the processor or processor workflow on the
    body's messages, with a fresh run context and the caller's resource; the reference's answer
    (`success`, `messages`, `tripwire` or `error`). The body was checked (`check_body`)."""
    phase = body["phase"]
    if phase not in call_lanes.PHASES.values():
        raise BadRequestError(f"phase: must be one of {', '.join(call_lanes.PHASES.values())}")
    messages = _messages(service, body["messages"])
    agent_id = body.get("agentId")
    if agent_id is not None and not isinstance(agent_id, str):
        raise BadRequestError("agentId: must be a string")
    if agent_id:
        service.agent(agent_id)  # a 404 naming the configured agents
    model = service.app.config.agents[agent_id].model if agent_id else ""
    choosing = {**context, "resourceId": resource} if resource else context
    target = _target(service, processor_id, agent_id, choosing)
    if phase not in target.phases:
        raise BadRequestError(f"{target.name} has no {phase} phase (it has {target.phases})")
    info = RunInfo(
        run_id=str(uuid.uuid4()), agent_id=agent_id or "", request_context=context, resource_id=resource
    )
    caller = GrpcHookCaller(info, service.app.metrics)
    try:
        if phase == "outputStream":
            outcome: Outcome | str = await _run_stream(caller, target.lane, messages)
        elif phase == "toolResult":
            outcome = await _run_tool_results(caller, target.lane, messages)
        else:
            outcome = await _run_messages(caller, target, phase, messages, model)
    except ProcessorFailedError as exc:
        return {"success": False, "phase": phase, "error": str(exc)}
    if isinstance(outcome, str):
        return {"success": False, "phase": phase, "error": outcome}
    shown, abort = outcome
    if abort is not None:
        return {
            "success": False,
            "phase": phase,
            "messages": shown,
            "messageList": {"messages": shown},
            "tripwire": {
                "triggered": True,
                "reason": abort.reason,
                "metadata": {**abort.as_dict(), "retry": abort.retry},
            },
        }
    return {"success": True, "phase": phase, "messages": shown, "messageList": {"messages": shown}}
