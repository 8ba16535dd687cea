"""The processors the sidecars host, as the HTTP API lists and runs them, and per-call lanes.

``listProcessors``/``getProcessor(id).details()`` show each processor a sidecar's ``Describe``
lists (and each processor workflow); ``getProcessor(id).execute()`` runs one phase of one on the
messages given, through the run's own `GrpcHookCaller`; `bind_lanes` binds a call's per-call
processor lists (``inputProcessors``, ...: ids of these processors) for both APIs.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from procmesh_orchestrator.config.schema import ProcessorRef, WorkflowRef, workflow_refs
from procmesh_orchestrator.errors import ConfigError, ProcessorFailedError, RequestContextError, TripwireAbort
from procmesh_orchestrator.processors import GrpcHookCaller, call_lanes
from procmesh_orchestrator.processors.call_lanes import Hosted
from procmesh_orchestrator.processors.lanes import ProcessorHandle
from procmesh_orchestrator.run.framework.prepare_step import StepModelError
from procmesh_orchestrator.run.hooks import (
    HookArgs,
    InputArgs,
    InputStepArgs,
    OutputResultArgs,
    OutputStepArgs,
    RunInfo,
    ToolResultArgs,
)
from procmesh_orchestrator.run.messages import message_text
from procmesh_orchestrator.service._auth import Caller
from procmesh_orchestrator.service._errors import (
    BadRequestError,
    CatalogNotFoundError,
    ForbiddenError,
    NotSupportedError,
)
from procmesh_orchestrator.service.api.calls import AgentCall
from procmesh_orchestrator.service.api.messages import db_message
from procmesh_orchestrator.service.api.results import dumps
from procmesh_orchestrator.store import label

if TYPE_CHECKING:
    from procmesh_orchestrator.config.schema import Config
    from procmesh_orchestrator.service.api.core import ServiceCore


def _refs(entries: list[Any], config: Config) -> Iterator[tuple[ProcessorRef | None, str | None]]:
    """The processor references of a lane, workflows' steps included: (ref, None) or (None, workflow)."""
    for entry in entries:
        if isinstance(entry, ProcessorRef):
            yield entry, None
        elif isinstance(entry, WorkflowRef):
            yield None, entry.workflow
            workflow = config.workflows.get(entry.workflow)
            for step in workflow.steps if workflow else []:
                if isinstance(step, WorkflowRef):
                    yield from _refs([step], config)
                else:
                    yield from ((r, None) for r in workflow_refs(step))


def hosted_processors(service: ServiceCore) -> dict[str, Hosted]:
    """Every processor the sidecars host, by id (`call_lanes.hosted_processors`)."""
    return call_lanes.hosted_processors(service.app.pipeline.sidecars)


def find_processor(service: ServiceCore, processor_id: str) -> Hosted:
    hosted = hosted_processors(service)
    found = call_lanes.find_hosted(hosted, processor_id)
    if found is None:
        raise CatalogNotFoundError(f"no processor {label(processor_id)} (hosted: {sorted(hosted)})")
    return found


def _configurations(
    service: ServiceCore, uses: Callable[[list[tuple[ProcessorRef | None, str | None]]], bool]
) -> list[dict[str, Any]]:
    """Each agent lane (input, output) whose references, workflows' steps included, `uses` holds for."""
    config = service.app.config
    return [
        {"agentId": agent_id, "agentName": agent_id, "type": kind}
        for agent_id, agent in config.agents.items()
        for kind in ("input", "output")
        if uses(list(_refs(list(agent.possible_entries(kind)), config)))
    ]


def processor_json(service: ServiceCore, hosted: Hosted, *, listing: bool) -> dict[str, Any]:
    """A processor as ``GET /processors`` (`listing`) or ``GET /processors/:id`` returns it."""
    configurations = _configurations(
        service,
        lambda refs: any(
            r is not None and r.sidecar == hosted.sidecar and r.processor_id == hosted.processor_id
            for r, _ in refs
        ),
    )
    body: dict[str, Any] = {
        "id": hosted.id,
        "name": hosted.name,
        "description": hosted.description,
        "phases": hosted.phases,
        "configurations": configurations,
        "isWorkflow": False,
    }
    if listing:
        body["agentIds"] = sorted({c["agentId"] for c in configurations})
        body["configurations"] = [{"agentId": c["agentId"], "type": c["type"]} for c in configurations]
    return body


def workflow_processor_json(service: ServiceCore, name: str, *, listing: bool) -> dict[str, Any]:
    configurations = _configurations(service, lambda refs: any(w == name for _, w in refs))
    body: dict[str, Any] = {
        "id": name,
        "name": f"workflow:{name}",
        "description": f"processor workflow {name!r}",
        "phases": ["input", "outputResult"],
        "configurations": configurations,
        "isWorkflow": True,
    }
    if listing:
        body["agentIds"] = sorted({c["agentId"] for c in configurations})
        body["configurations"] = [{"agentId": c["agentId"], "type": c["type"]} for c in configurations]
    return body


def bind_lanes(service: ServiceCore, agent_id: str, call: AgentCall, caller: Caller) -> AgentCall:
    """The call with its per-call processor lists bound (`call_lanes.bind`), their names kept for
    a snapshot (`CallOptions.processor_names`: a resumed run binds them again), and its lanes
    checked against its request context (a processor option it sets that the processor's schema
    refuses is a 400 naming the processor, the option and the key, before any run starts).

    Replacing an agent's processors drops its guards for the call, so only an operator key may
    (or any caller when no key is configured): a tenant key gets a 403.
    """
    if call.lanes:
        fields = ", ".join(call_lanes.LANE_FIELDS[kind] for kind in call.lanes)
        if not caller.operator:
            raise ForbiddenError(
                f"{fields}: replacing an agent's processors needs an operator key (a PROCMESH_API_KEYS "
                "entry 'key=@operator'): it drops the agent's guards for the call"
            )
        try:
            lanes = service.app.agent(agent_id).spec.lanes
            bound = call_lanes.bind(service.app.binder, lanes, call.lanes)
        except ConfigError as exc:  # names nothing here, or needs options the agent does not give it
            raise BadRequestError(str(exc)) from None
        call.options = replace(
            call.options,
            input_processors=bound.get("input"),
            output_processors=bound.get("output"),
            error_processors=bound.get("error"),
            processor_names={kind: list(ids) for kind, ids in call.lanes.items()},
        )
    try:
        service.agent(agent_id).check_call(call.options)
    except (RequestContextError, StepModelError) as exc:
        raise BadRequestError(str(exc)) from None
    return call


Outcome = tuple[list[dict[str, Any]], TripwireAbort | None]
"""What executing a phase gave: the messages after it, or the abort that stopped it."""


async def _run_stream(
    caller: GrpcHookCaller, handle: ProcessorHandle, messages: list[dict[str, Any]]
) -> Outcome:
    """``outputStream``: each text part of the assistant messages as one ``text-delta`` chunk
    (then ``finish``), through the processor's ProcessOutputStream session; each part's text
    becomes what came out of the session for it."""
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
    async with contextlib.aclosing(caller.stream([handle], source(), announce_signals=False)) as items:
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
    caller: GrpcHookCaller, handle: ProcessorHandle, messages: list[dict[str, Any]]
) -> Outcome:
    """``toolResult``: ProcessToolResult on each tool result in the messages (a ``tool-invocation``
    part in state ``result``), in order; a replaced result goes into its part."""
    shown = [json.loads(dumps(m)) for m in messages]  # a copy the results are written into
    found = False
    for message in shown:
        for part in (message.get("content") or {}).get("parts") or []:
            inv = part.get("toolInvocation") if part.get("type") == "tool-invocation" else None
            if not isinstance(inv, dict) or inv.get("state") != "result":
                continue
            found = True
            args = ToolResultArgs(
                str(inv.get("toolName", "")),
                str(inv.get("toolCallId", "")),
                inv.get("args"),
                inv.get("result"),
                messages,
                [],
            )
            reply = await caller.call(handle, args)
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


_NO_USAGE = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}


def _hook_args(phase: str, messages: list[dict[str, Any]], model: str) -> HookArgs[Any]:
    text = message_text(messages[-1]) if messages and messages[-1].get("role") == "assistant" else ""
    usage = {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}
    if phase == "input":
        return InputArgs(messages, messages, [])
    if phase == "inputStep":
        return InputStepArgs(model, messages, [], [], "auto", None, {}, {}, [])
    if phase == "outputStep":
        return OutputStepArgs(text, "stop", messages, [], [], usage, [])
    return OutputResultArgs(messages, text, "stop", usage, [])


async def execute_phase(
    service: ServiceCore, processor_id: str, body: dict[str, Any], context: dict[str, Any], resource: str
) -> dict[str, Any]:
    """``POST /processors/{id}/execute``: one phase of the processor on the body's messages, with
    the options ``agentId``'s lanes give it (else none), a fresh run context and the caller's
    resource; the reference's answer (`success`, `messages`, `tripwire` or `error`)."""
    if processor_id in service.app.config.workflows and processor_id not in hosted_processors(service):
        raise NotSupportedError(
            "executing a processor workflow is not supported by procmesh: "
            "procmesh runs processor workflows inside agents only"
        )
    hosted = find_processor(service, processor_id)
    phase = body.get("phase")
    if phase not in call_lanes.PHASES.values():
        raise BadRequestError(f"phase: must be one of {', '.join(call_lanes.PHASES.values())}")
    if phase not in hosted.phases:
        raise BadRequestError(f"processor {hosted.id!r} has no {phase} phase (it has {hosted.phases})")
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise BadRequestError("messages: must be a list of messages")
    if len(raw) > service.limits.max_messages:
        raise BadRequestError(f"messages: at most {service.limits.max_messages}")
    messages = [db_message(m, f"messages.{i}") for i, m in enumerate(raw)]
    agent_id = body.get("agentId")
    if agent_id is not None and not isinstance(agent_id, str):
        raise BadRequestError("agentId: must be a string")
    lanes = service.app.agent(agent_id).spec.lanes if agent_id else None
    try:
        handle = call_lanes.handle(service.app.binder, hosted, lanes)
    except ConfigError as exc:  # options it requires, which no lane of agentId's gives it
        raise BadRequestError(
            f"processor {hosted.id!r} needs options to run: {exc} (send the agentId of an agent "
            "whose lanes configure it)"
        ) from None
    model = service.app.config.agents[agent_id].model if agent_id else ""
    info = RunInfo(
        run_id=str(uuid.uuid4()), agent_id=agent_id or "", request_context=context, resource_id=resource
    )
    caller = GrpcHookCaller(info, service.app.metrics)
    try:
        if phase == "outputStream":
            shown, abort = await _run_stream(caller, handle, messages)
        elif phase == "toolResult":
            shown, abort = await _run_tool_results(caller, handle, messages)
        else:
            reply = await caller.call(handle, _hook_args(phase, messages, model))
            abort = reply.effects.abort
            if abort is None and reply.result is None:
                return {"success": False, "phase": phase, "error": "the processor failed (fail-open)"}
            out = getattr(reply.result, "messages", None)
            shown = messages if out is None else out
    except ProcessorFailedError as exc:
        return {"success": False, "phase": phase, "error": str(exc)}
    if abort is not None:
        return {
            "success": False,
            "phase": phase,
            "messages": messages,
            "messageList": {"messages": messages},
            "tripwire": {
                "triggered": True,
                "reason": abort.reason,
                "metadata": {**abort.as_dict(), "retry": abort.retry},
            },
        }
    return {"success": True, "phase": phase, "messages": shown, "messageList": {"messages": shown}}
